package quarantine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// An event written to an events stream that was never declared (replay's
// claim, purge, the runtime's own events) says so, as every command that
// reads the stream does, rather than only "message unroutable".
func TestEventToAMissingStreamSaysTheTopologyIsMissing(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	pub, err := amqpx.NewPublisher(env.Dial("events-missing"))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	stream := env.Name("never-declared.events")
	err = publishEvent(ctx, pub, nil, stream, Event{Kind: EventClaimed, Run: "r1"})
	if !errors.Is(err, amqpx.ErrUnroutable) || !strings.Contains(err.Error(), "was the topology applied?") || !strings.Contains(err.Error(), stream) {
		t.Fatalf("got %v, want an unroutable error naming %s and the missing topology", err, stream)
	}
}
