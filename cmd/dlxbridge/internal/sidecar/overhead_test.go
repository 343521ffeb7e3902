package sidecar

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/schemas"
)

// span records when the first and the n-th of n calls happened.
type span struct {
	mu          sync.Mutex
	n, seen     int
	first, last time.Time
	done        chan struct{}
}

func (s *span) hit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == 0 {
		s.first = time.Now()
	}
	s.seen++
	if s.seen == s.n {
		s.last = time.Now()
		close(s.done)
	}
}

func (s *span) rate() float64 { return float64(s.n-1) / s.last.Sub(s.first).Seconds() }

// TestSidecarOverhead measures, and does not judge, messages per second on
// one clean workload (every message valid, every handler succeeding at
// once): the in-process runtime with a no-op handler, then `dlxbridge run`
// forwarding to an endpoint that answers 204, with the same queue settings
// (concurrency 4, prefetch 10). The rate is taken between the first and
// the last handler call, so process start-up is left out. Runs only with
// DLXBRIDGE_MEASURE=1 (performance targets are never timed tests).
func TestSidecarOverhead(t *testing.T) {
	if os.Getenv("DLXBRIDGE_MEASURE") == "" {
		t.Skip("set DLXBRIDGE_MEASURE=1 to measure the sidecar's overhead")
	}
	env := brokertest.Require(t)
	const n = 5000
	bodies := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("m-%05d", i)
		bodies[id] = fmt.Sprintf(`{"id":%q}`, id)
	}

	side := &span{n: n, done: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		side.hit()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	cfgPath := writeSidecarConfig(t, env, srv.URL, 4)

	// In process first (the sidecar's start declares the topology).
	p := startSidecarOn(t, env, cfgPath)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.exited
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := schemas.Load(schemas.LoadOptions{Dir: cfg.Schemas.Dir})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, env, env.Name("ex"), bodies)
	in := &span{n: n, done: make(chan struct{})}
	c, err := consumer.New(&consumer.Config{URL: env.URL, File: cfg, Registry: reg,
		ConnectionName: env.Prefix + "/inprocess", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Handle(cfg.Queues[0].Name, "test.job", consumer.HandlerFunc(func(context.Context, *consumer.Message) error {
		in.hit()
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	select {
	case <-in.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("in-process: not all handled within 2 minutes")
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}

	// The sidecar on the same workload.
	publish(t, env, env.Name("ex"), bodies)
	startSidecarOn(t, env, cfgPath)
	select {
	case <-side.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("sidecar: not all forwarded within 2 minutes")
	}
	t.Logf("clean workload, %d messages, concurrency 4, prefetch 10, broker %s: in-process %.0f msg/s, sidecar %.0f msg/s (%.0f%%)",
		n, env.ServerVersion, in.rate(), side.rate(), 100*side.rate()/in.rate())
}
