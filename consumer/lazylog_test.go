package consumer

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
)

// countingHandler counts WithAttrs calls: the formatting slog's own
// handlers do there.
type countingHandler struct {
	slog.Handler
	withAttrs *atomic.Int64
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.withAttrs.Add(1)
	return countingHandler{h.Handler.WithAttrs(as), h.withAttrs}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{h.Handler.WithGroup(name), h.withAttrs}
}

// The per-message logger a failure makes (queue, message id, class, ...)
// formats nothing unless a line is written, and a written line carries
// every attribute, in order, as before.
func TestRuntimeLoggerDefersWithUntilALineIsWritten(t *testing.T) {
	t.Parallel()
	file := ungatedOrders(t, "")
	var out syncBuffer
	var n atomic.Int64
	c, err := New(&Config{
		URL: "amqp://guest:guest@127.0.0.1:5672/", File: file, SigningKey: []byte("0123456789abcdef-log"),
		Logger: slog.New(countingHandler{slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn}), &n}),
	})
	if err != nil {
		t.Fatal(err)
	}
	base := n.Load()
	log := c.deps.log.With("queue", "orders", "message_id", "m-1").With("attempt", 2)
	log.Info("retry scheduled", "tier", 0) // below the level
	if got := n.Load() - base; got != 0 {
		t.Fatalf("With on the runtime's logger formatted %d times with no line written, want 0", got)
	}
	log.WithGroup("g").Warn("quarantined", "reason", "r")
	lines := out.records(t, "quarantined")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1: %s", len(lines), out.String())
	}
	r := lines[0]
	if r["component"] != "dlxbridge.consumer" || r["queue"] != "orders" || r["message_id"] != "m-1" || r["attempt"] != float64(2) {
		t.Errorf("attributes lost: %v", r)
	}
	if g, _ := r["g"].(map[string]any); g["reason"] != "r" {
		t.Errorf("group lost: %v", r)
	}
	if s := out.String(); strings.Index(s, `"queue"`) > strings.Index(s, `"attempt"`) {
		t.Errorf("attribute order changed: %s", s)
	}
}
