package consumer

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// A pattern within schemas.MaxPatternInsts that costs its size on every
// byte of a long string of letters without an "x": seconds of CPU for the
// 256 KiB value below.
const gateCostlyPattern = `[a-z]{0,900}x`

// The schema gate is bounded by the handler timeout: a message whose check
// would take seconds (a costly-but-allowed pattern on a 256 KiB string)
// stops at the deadline, in either gate mode, and settles as a handler
// that timed out would (retried, class timeout: never acked, never
// handled); the worker is free for the next message at once.
func TestGateStopsAtTheHandlerTimeout(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "orders.created"), 0o755); err != nil {
		t.Fatal(err)
	}
	schema := `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
		"properties": {"name": {"type": "string", "pattern": "` + gateCostlyPattern + `"}}}`
	if err := os.WriteFile(filepath.Join(dir, "orders.created", "v2.json"), []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := schemas.Load(schemas.LoadOptions{Dir: dir, NoEmbedded: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{config.GateEnforce, config.GateReport} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			const timeout = 200 * time.Millisecond
			handled := make(chan string, 4)
			b := newProcessBundle(t, func(c *Config) {
				c.Registry = reg
				q := &c.File.Queues[0]
				q.Gate = mode
				q.Consumer.HandlerTimeout = timeout
			}, func(_ context.Context, m *Message) error {
				handled <- m.MessageID
				return nil
			})
			fed, _ := b.loopWorker(t)

			long := []byte(`{"name":"` + strings.Repeat("a", 256<<10) + `"}`)
			b.body = long
			begin := time.Now()
			fed <- b.fed()
			st := b.waitSettled(t)
			took := time.Since(begin)
			if st.Outcome != OutcomeRetried || st.Class != triage.ClassTimeout {
				t.Fatalf("settled %s, class %q (%v); want retried, timeout", st.Outcome, st.Class, st.Err)
			}
			if st.Err == nil || !strings.Contains(st.Err.Error(), "schema gate: the check did not finish within the handler timeout (200ms)") {
				t.Errorf("the error does not say the gate stopped: %v", st.Err)
			}
			if took > 3*time.Second {
				t.Errorf("settled after %s with a %s handler timeout", took, timeout)
			}
			if n := b.acked.Load(); n != 0 {
				t.Errorf("%d acks: the stopped message was acked, not retried", n)
			}
			select {
			case id := <-handled:
				t.Fatalf("the handler got %s, which the gate did not finish checking", id)
			default:
			}

			// The worker goes on with the next message.
			b.body = []byte(`{"name":"` + strings.Repeat("a", 100) + `x"}`)
			fed <- b.fed()
			if st := b.waitSettled(t); st.Outcome != OutcomeAcked {
				t.Fatalf("the next message settled %s (%v), want acked", st.Outcome, st.Err)
			}
		})
	}
}
