package consumer

import (
	"fmt"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A runtime without a configured key signs with a random key of its own,
// and its keeper keeps a redrive count as claimed (it cannot verify
// anything): its own quarantine must keep the count as claimed too, or no
// record it writes ever has a prior replay, and max_redrives never stops
// a message that fails again after every replay.
func TestRuntimeWithARandomKeyKeepsTheClaimedRedriveCount(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	b.w.deps.verifier = keeperVerifier(b.w.deps.signer, true) // as New does with no key
	d := delivery()
	d.Headers[wire.HeaderRedriveCount] = int64(2) // a replay without a key signs nothing
	got, err := build(b.input(d, quarantineFailure()))
	if err != nil {
		t.Fatal(err)
	}
	if n := got.p.Headers[wire.HeaderRedriveCount]; n != int64(2) {
		t.Errorf("the quarantine's redrive count is %#v, want the claimed 2: replays would never use up max_redrives", n)
	}
	// The keeper gets the same verifier: nil, with which it keeps an
	// integer count as claimed (quarantine's
	// TestPublishingWithARandomKeyKeepsACountTheKeeperReads).
	if b.w.deps.verifier != nil {
		t.Errorf("the keeper's verifier is %v, want none: it would read 0 prior replays, not 2", b.w.deps.verifier)
	}
}

// With a random key, a claimed count that is no integer is still removed:
// the count is an essential header, which fitting never drops.
func TestRuntimeWithARandomKeyDropsACountThatIsNoInteger(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	b.w.deps.verifier = keeperVerifier(b.w.deps.signer, true)
	d := delivery()
	d.Headers[wire.HeaderRedriveCount] = amqp.Table{"pad": strings.Repeat("x", frame.DefaultFrameSize-2048)}
	got, err := build(b.input(d, quarantineFailure()))
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := got.p.Headers[wire.HeaderRedriveCount]; ok {
		t.Errorf("a table count of %d bytes kept", len(fmt.Sprint(n)))
	}
}
