package consumer

import (
	"runtime/debug"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/quarantine"
)

// deepPanic panics depth frames down, so its stack is long.
func deepPanic(depth int) {
	if depth == 0 {
		var m map[string]int
		m["boom"]++
	}
	deepPanic(depth - 1)
}

func recoveredStack(depth int) (stack []byte) {
	defer func() {
		if recover() != nil {
			stack = debug.Stack()
		}
	}()
	deepPanic(depth)
	return nil
}

func TestPanicStackKeepsThePanickingFrames(t *testing.T) {
	t.Parallel()
	short := trimStack(recoveredStack(1))
	if !strings.HasPrefix(short, "goroutine ") || !strings.Contains(short, "consumer.deepPanic") ||
		strings.Contains(short, "runtime/debug.Stack") || strings.Contains(short, "\npanic(") {
		t.Errorf("short stack: want the goroutine line and the panicking frames, without the recovery:\n%s", short)
	}
	long := trimStack(recoveredStack(500))
	if len(long) > quarantine.MaxStackBytes || !strings.HasSuffix(long, "…[truncated]") || !strings.Contains(long, "consumer.deepPanic") || !utf8.ValidString(long) {
		t.Errorf("long stack: %d bytes (limit %d):\n%s", len(long), quarantine.MaxStackBytes, long)
	}
	if trimStack(nil) != "" {
		t.Error("no stack should give an empty string")
	}
}
