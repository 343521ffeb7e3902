package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/triage"
)

// During a memory alarm the broker stops reading from a connection once it
// publishes, acks included: so the runtime publishes only on its
// publishing connection, and its consuming connection goes on acking what
// it handled. Automatic redrive publishes too (outage events, replays):
// what it writes when the breaker turns during an alarm must
// not block the consuming connection. Here the breaker closes during an
// alarm: the outage's end and the redrive are published. Before, the
// redriver and the quarantine refresher (which writes expiry and
// carry-forward events) ran on the consuming connection, and the broker
// blocked it.
func TestAutoRedriveNeverBlocksTheConsumingConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("resource alarm on a private broker node: skipped in -short")
	}
	node := brokertest.StartPrivateNodeWith(t, brokertest.NodeOptions{Plugins: []string{"rabbitmq_management"}})
	env := node.Env(t)
	b := setupOn(t, env, autoRedriveQueue)
	b.cfg.DrainTimeout = 2 * time.Second
	transitions := make(chan triage.BreakerState, 64)
	b.cfg.hooks.breaker = func(_ string, tr triage.Transition) { transitions <- tr.To }
	waitFor := func(state triage.BreakerState) {
		t.Helper()
		for deadline := time.After(60 * time.Second); ; {
			select {
			case s := <-transitions:
				if s == state {
					return
				}
			case <-deadline:
				t.Fatalf("the breaker did not turn %v", state)
			}
		}
	}
	for i := range 30 {
		b.publishJSON(map[string]any{"id": fmt.Sprint(i)}, amqp.Publishing{MessageId: fmt.Sprintf("m-%02d", i)})
	}
	var down atomic.Bool
	down.Store(true)
	stop := b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(context.Context, *Message) error {
			if down.Load() {
				return triage.DependencyDown(0, errors.New("payments API: 503"))
			}
			return nil
		})))
	})
	waitFor(triage.BreakerOpen)
	node.RaiseMemoryAlarm()
	t.Cleanup(node.ClearMemoryAlarm) // runs before the node stops (cleanups run last-in first-out)
	// The dependency is back: the next probe succeeds (an ack, on the
	// consuming connection), the breaker closes, and the redriver writes
	// the outage's end and then replays what it parked.
	down.Store(false)
	waitFor(triage.BreakerClosed)
	// The broker reports a connection's state with its statistics (every
	// 5 s by default): look for twice that.
	consuming := b.cfg.ConnectionName
	for deadline := time.Now().Add(12 * time.Second); time.Now().Before(deadline); {
		var conns []struct {
			Name  string `json:"user_provided_name"`
			State string `json:"state"`
		}
		if err := json.Unmarshal(env.ManagementGet("/api/connections?columns=user_provided_name,state"), &conns); err != nil {
			t.Fatal(err)
		}
		for _, c := range conns {
			if c.Name == consuming && c.State == "blocked" {
				t.Fatalf("the consuming connection %q is blocked by the memory alarm: something published on it (states: %+v)", consuming, conns)
			}
		}
		time.Sleep(500 * time.Millisecond) // polling the management API
	}
	// It stops within brokertest.Run's bound with the alarm still on:
	// before, the redriver and the quarantine refresher waited on the
	// blocked connection for a confirm or a channel, and Run did not
	// return until the alarm cleared.
	stop()
}
