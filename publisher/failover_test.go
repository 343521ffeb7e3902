package publisher_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dlxbridge/dlxbridge/publisher"
	"github.com/dlxbridge/dlxbridge/schemas"
)

// lockedBuffer is a log sink for the publisher's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines decodes the JSON log lines whose message is msg.
func (b *lockedBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(b.buf.Bytes()), []byte("\n")) {
		var r map[string]any
		if err := json.Unmarshal(l, &r); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// A Publisher from Connect on a list whose first node is down publishes
// through the second; when that node goes down under load it connects to
// the third and goes on. Every Publish that returned nil is in the queue:
// a publish in flight at the cut fails (it was never confirmed) instead
// of being reported sent, and the caller sends it again.
func TestConnectFailsOverWithConfirmsIntact(t *testing.T) {
	t.Parallel()
	b := setup(t, schemas.Identity{})
	reg, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	second, third := b.env.Proxy(), b.env.Proxy()
	var logs lockedBuffer
	ctx := context.Background()
	pub, err := publisher.Connect(ctx, "amqp://guest:guest@127.0.0.1:1/,"+second.URL+","+third.URL, b.env.Prefix+"/failover",
		publisher.Config{Registry: reg, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })

	const total, cutAt, senders = 300, 100, 4
	var confirmed sync.Map // id → true
	var nConfirmed, failures atomic.Int32
	cut := make(chan struct{})
	var cutOnce sync.Once
	var wg sync.WaitGroup
	next := atomic.Int32{}
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				id := fmt.Sprintf("m-%03d", i)
				for try := 0; ; try++ {
					err := pub.Publish(ctx, b.ex, "order.created", publisher.Message{Type: "orders.created", Version: "1", Body: []byte(orderV1), MessageID: id})
					if err == nil {
						confirmed.Store(id, true)
						if nConfirmed.Add(1) == cutAt {
							cutOnce.Do(func() { close(cut) })
						}
						break
					}
					failures.Add(1)
					var invalid *schemas.ValidationError
					if errors.Is(err, publisher.ErrUnroutable) || errors.As(err, &invalid) || try > 20 {
						t.Errorf("%s: %v", id, err)
						return
					}
				}
			}
		}()
	}
	sent := make(chan struct{})
	go func() { wg.Wait(); close(sent) }()
	select {
	case <-cut:
		second.Down()
	case <-sent:
		t.Fatal("every sender stopped before the cut")
	}
	<-sent
	if t.Failed() {
		return
	}

	// What the queue holds, read past the proxies.
	got := map[string]int{}
	for {
		d, ok, err := b.ch.Get(b.queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got[d.MessageId]++
	}
	dups, missing := 0, 0
	confirmed.Range(func(k, _ any) bool {
		if got[k.(string)] == 0 {
			missing++
			t.Errorf("%s was confirmed to the caller but is not in the queue", k)
		}
		return true
	})
	for _, n := range got {
		dups += n - 1
	}
	t.Logf("%d confirmed, %d publishes failed at the cut and were sent again, %d in the queue, %d duplicates", nConfirmed.Load(), failures.Load(), len(got), dups)
	if int(nConfirmed.Load()) != total || len(got) != total || missing != 0 {
		t.Errorf("confirmed %d, queue holds %d distinct, %d missing; want %d, %d, 0", nConfirmed.Load(), len(got), missing, total, total)
	}
	var nodes []any
	for _, r := range logs.lines(t, "connected") {
		nodes = append(nodes, r["node"])
	}
	if len(nodes) != 2 || nodes[0] != second.Addr || nodes[1] != third.Addr {
		t.Errorf("connected to %v, want %s then %s", nodes, second.Addr, third.Addr)
	}
	if skipped := logs.lines(t, "node did not answer; trying the next"); len(skipped) != 1 || skipped[0]["node"] != "127.0.0.1:1" {
		t.Errorf("nodes passed over: %v, want only the dead first one", skipped)
	}
}

// A Publisher given its connection by New does not connect again: once
// that connection is closed, Publish fails with ErrClosed.
func TestNewPublisherDoesNotReconnect(t *testing.T) {
	t.Parallel()
	b := setup(t, schemas.Identity{})
	reg, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conn := b.env.Dial("own")
	pub, err := publisher.New(conn, publisher.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	err = pub.Publish(context.Background(), b.ex, "order.created", publisher.Message{Type: "orders.created", Version: "1", Body: []byte(orderV1)})
	if !errors.Is(err, publisher.ErrClosed) {
		t.Fatalf("Publish after the connection closed: %v, want ErrClosed", err)
	}
}
