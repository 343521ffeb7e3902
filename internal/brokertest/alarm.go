package brokertest

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// RaiseMemoryAlarm sets the node's memory high watermark so low that its
// memory alarm goes off, and returns once the alarm is in force: a probe
// connection that publishes has been blocked by the broker. From then on
// the node stops reading from every connection that publishes, until
// ClearMemoryAlarm. Only for a private node: never on the shared broker.
func (n *Node) RaiseMemoryAlarm() {
	n.t.Helper()
	if out, err := n.ctl(60*time.Second, "set_vm_memory_high_watermark", "absolute", "1"); err != nil {
		n.t.Fatalf("raise the memory alarm on %s: %v\n%s", n.Name, err, out)
	}
	conn, err := amqpx.Dial(n.URL, "brokertest/alarm-probe")
	if err != nil {
		n.t.Fatalf("alarm probe: %v", err)
	}
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		n.t.Fatalf("alarm probe channel: %v", err)
	}
	// A connection is blocked only once it publishes during an alarm; an
	// unroutable message on the default exchange is dropped by the broker.
	if err := ch.PublishWithContext(context.Background(), "", "brokertest.alarm-probe.nobody", false, false, amqp.Publishing{}); err != nil {
		_ = conn.Close()
		n.t.Fatalf("alarm probe publish: %v", err)
	}
	select {
	case b := <-blocked:
		if !b.Active {
			n.t.Fatalf("alarm probe: got connection.unblocked, want blocked")
		}
	case <-time.After(60 * time.Second):
		_ = conn.Close()
		n.t.Fatalf("the memory alarm on %s did not block a publishing connection within 60s", n.Name)
	}
	n.mu.Lock()
	n.alarmProbe, n.alarmBlocked = conn, blocked
	n.mu.Unlock()
}

// ClearMemoryAlarm restores the default watermark (0.4 of the machine's
// memory) and returns once the connection blocked by RaiseMemoryAlarm has
// been unblocked.
func (n *Node) ClearMemoryAlarm() {
	n.t.Helper()
	if out, err := n.ctl(60*time.Second, "set_vm_memory_high_watermark", "0.4"); err != nil {
		n.t.Fatalf("clear the memory alarm on %s: %v\n%s", n.Name, err, out)
	}
	n.mu.Lock()
	conn, blocked := n.alarmProbe, n.alarmBlocked
	n.alarmProbe, n.alarmBlocked = nil, nil
	n.mu.Unlock()
	if conn == nil {
		return
	}
	timeout := time.After(60 * time.Second)
	for {
		select {
		case b, ok := <-blocked:
			if !ok || !b.Active {
				// Only now: Close waits for close-ok, which the broker
				// sends a blocked connection only once it is unblocked.
				_ = conn.Close()
				return
			}
		case <-timeout:
			n.t.Fatalf("the memory alarm on %s did not clear within 60s", n.Name)
		}
	}
}
