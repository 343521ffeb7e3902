package consumer

import (
	"bytes"
	"context"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
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

// A failure's panic stack is trimmed once, by buildCopy, for its log line
// and the quarantine record alike: trimming copies all of the captured
// stack, which deep recursion makes megabytes long, and a retry's
// publishing never reads it. A retry that does not fit one frame is built
// twice (parked in the quarantine), still with one trim.
func TestBuildCopyTrimsAPanicStackOnce(t *testing.T) {
	const size = 8 << 20
	stack := append([]byte("goroutine 1 [running]:\n"), bytes.Repeat([]byte("main.deep()\n\t/src/main.go:1 +0x1\n"), size/33)...)
	for _, c := range []struct {
		name     string
		frameMax int
		big      int
		want     Outcome
	}{
		{"retry", frame.DefaultFrameSize, 0, OutcomeRetried},
		{"retry parked in the quarantine", 4096, 8000, OutcomeQuarantined},
	} {
		b := newSettleBundle(t, c.frameMax)
		d := delivery()
		if c.big > 0 {
			d.Headers["x-big"] = strings.Repeat("b", c.big)
		}
		f := retryFailure()
		f.err = &triage.PanicError{Value: "boom", Stack: stack}
		var kind outcomeKind
		build := func() {
			o := b.w.buildCopy(outcome{kind: kindFailed, a: &fakeAcker{}, d: d, ctx: context.Background(), span: noop.Span{}, failed: &failedOutcome{f: f}})
			kind = o.kind
		}
		build() // warm: the first call's allocations are not a trim's
		const runs = 3
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			build()
		}
		runtime.ReadMemStats(&after)
		if got, _ := kind.labels(); got != c.want {
			t.Fatalf("%s: built %v, want %v", c.name, got, c.want)
		}
		// One trim copies the stack once; two would copy it twice.
		if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > size*3/2 {
			t.Errorf("%s: %d MB allocated per failure for a %d MB stack: trimmed more than once", c.name, per>>20, size>>20)
		}
	}
}
