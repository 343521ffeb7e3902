package quarantine

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// During a memory alarm the broker reads nothing more from a connection
// that publishes, so the keeper's record publish waits for a confirm that
// will not come until the alarm clears. Cancelling the keeper must still
// end it (the runtime's stop waits for every keeper), and the intake must
// keep the message. A record written but not acked is written again with
// the same id, which readers keep once.
func TestKeeperStopsWhileItsPublishIsBlocked(t *testing.T) {
	if testing.Short() {
		t.Skip("resource alarm on a private broker node: skipped in -short")
	}
	node := brokertest.StartPrivateNode(t)
	env := node.Env(t)
	intake, records := env.Name("q"), env.Name("q.records")
	ch := env.Channel("setup")
	if _, err := ch.QueueDeclare(intake, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(records, true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(context.Background(), "", intake, true, false, amqp.Publishing{MessageId: "m", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	alarmOn := true
	node.RaiseMemoryAlarm()
	t.Cleanup(func() {
		if alarmOn {
			node.ClearMemoryAlarm()
		}
	})
	pubConn := env.Dial("keeper-pub")
	blocked := pubConn.NotifyBlocked(make(chan amqp.Blocking, 4))
	k := &Keeper{Consume: env.Dial("keeper"), Publish: pubConn, Intake: intake, Records: records}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	select {
	case b := <-blocked:
		if !b.Active {
			t.Fatal("unblocked, want blocked")
		}
	case err := <-done:
		t.Fatalf("keeper ended before its publish was blocked: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the keeper's publishing connection was not blocked within 60s")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the keeper did not stop within 10s of its cancel while its publish was blocked")
	}
	node.ClearMemoryAlarm()
	alarmOn = false
	q, err := env.Channel("check").QueueDeclarePassive(intake, true, false, false, false, nil)
	if err != nil || q.Messages != 1 {
		t.Fatalf("intake holds %d (%v), want the message", q.Messages, err)
	}
}
