package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// Many reconnects with retry publishes awaiting confirms leave no
// goroutine behind: each session's workers, settlers,
// confirm pipelines and their watchers end with it. Not parallel: the
// count is the process's.
func TestReconnectsLeakNoGoroutines(t *testing.T) {
	if testing.Short() {
		t.Skip("fault injection on a private broker node: skipped in -short")
	}
	node := brokertest.StartPrivateNode(t)
	b := setupOn(t, node.Env(t), func(q *config.Queue) {
		q.Consumer.Prefetch = 20
		q.Consumer.Concurrency = 4
	})
	var settled atomic.Int64
	b.cfg.OnSettled = func(Settled) { settled.Add(1) }
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(_ context.Context, m *Message) error {
			if m.Attempt == 1 && len(m.MessageID)%2 == 0 {
				return errors.New("transient: once")
			}
			return nil
		})))
	})
	round := func(r int) {
		t.Helper()
		want := settled.Load() + 20
		// The test's own connection is closed with the others: a fresh one
		// each round.
		conn, err := amqp.Dial(b.env.URL)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Confirm(false)
		}
		if err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			dc, err := ch.PublishWithDeferredConfirm(b.queue.Exchange.Name, "job.test", true, false, amqp.Publishing{
				ContentType: "application/json", Type: testType, Headers: amqp.Table{"schema-version": "1"},
				MessageId: fmt.Sprint("m-", r, "-", i), Body: []byte(fmt.Sprintf(`{"id":"%d-%d"}`, r, i))})
			if err != nil || !dc.Wait() {
				t.Fatalf("round %d: publish: %v", r, err)
			}
		}
		_ = conn.Close()
		for deadline := time.Now().Add(60 * time.Second); settled.Load() < want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d settled, want %d", r, settled.Load(), want)
			}
		}
	}
	round(0)
	settle := func() int {
		time.Sleep(500 * time.Millisecond)
		runtime.GC()
		return runtime.NumGoroutine()
	}
	before := settle()
	const reconnects = 8
	for r := 1; r <= reconnects; r++ {
		if err := node.CloseAllConnections("leak test"); err != nil {
			t.Fatal(err)
		}
		b.waitConsumingWithin(60 * time.Second)
		round(r)
	}
	after := settle()
	t.Logf("goroutines: %d before, %d after %d reconnects", before, after, reconnects)
	if after > before+reconnects/2 {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines grew from %d to %d over %d reconnects:\n%s", before, after, reconnects, buf[:runtime.Stack(buf, true)])
	}
}
