package quarantine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A stream that keeps growing (an incident quarantining dozens of messages
// a second, or a replay at --rate 40 writing a replayed event per message)
// may never fall silent for the idle wait (50 ms): finding its end must
// still end, not only once the consumer at "last" holds its 5000 unacked
// deliveries (125 s at 40/s). Here the idle wait is longer than the
// writer's interval, so that no gap ever ends the wait, as at 40/s one
// rarely does on a quiet machine.
func TestFindingTheEndOfAGrowingStreamEnds(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	stream := b.q.Quarantine.EventsStream()
	publishN(t, b, stream, 10)
	stop := make(chan struct{})
	writing := make(chan struct{}) // closed once the writer has published a few
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // another writer on its own connection, an event every 25 ms
		defer wg.Done()
		ch, err := b.env.Dial("busy").Channel()
		if err != nil {
			t.Error(err)
			return
		}
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			_ = ch.PublishWithContext(context.Background(), "", stream, false, false, amqp.Publishing{Body: []byte("{}")})
			if n == 5 {
				close(writing)
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	select {
	case <-writing:
	case <-time.After(30 * time.Second):
		t.Fatal("the writer did not get going")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // far above the 1.5 s of a quiet stream
	defer cancel()
	start := time.Now()
	end, found, err := lastOffset(ctx, b.env.Dial("reader"), stream, streamWaits{empty: 1500 * time.Millisecond, idle: 2 * time.Second})
	if err != nil || !found || end < 9 {
		t.Fatalf("the end of a growing stream: %d %v %v, after %s", end, found, err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("found the end (%d) in %s", end, time.Since(start).Round(time.Millisecond))
}

// Reading a records stream in two parts while it grows returns a
// run of offsets, each once, in order: the offsets one consumer reads up
// to the same end (none lost or read twice at the halves).
func TestReadStreamPartsWhileTheStreamGrows(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	stream := b.q.Quarantine.RecordsStream()
	publishN(t, b, stream, splitFrom+500)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ch, err := b.env.Dial("grow").Channel()
		if err != nil {
			t.Error(err)
			return
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_ = ch.PublishWithContext(context.Background(), "", stream, false, false, amqp.Publishing{Body: []byte{byte(i)}})
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	two := readOffsets(t, b, stream, 2)
	checkIncreasing(t, two, 0)
	var one []int64
	err := consumeFrom(context.Background(), b.env.Dial("one"), stream, "first", func(off int64, _ *amqp.Delivery) error {
		one = append(one, off)
		if off >= two[len(two)-1] {
			return errStopRead
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(one, two) {
		t.Fatalf("two parts read %d offsets, one consumer %d up to the same end (%d)", len(two), len(one), two[len(two)-1])
	}
}

// readOffsets reads stream in parts and returns the offsets, the parts
// joined.
func readOffsets(t *testing.T, b *storeBundle, stream string, parts int) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	out := make([][]int64, parts)
	// Generous waits: with the defaults a loaded machine can pause the
	// last chunk's delivery past the idle wait, and two reads then find
	// different ends (CI saw 12440 and 12461): what these tests compare is
	// the parts, not how the end is found.
	waits := streamWaits{empty: 5 * time.Second, idle: time.Second}
	err := readStreamParts(ctx, b.env.Dial("reader"), stream, waits, parts, func(part int, off int64, _ *amqp.Delivery) error {
		mu.Lock()
		out[part] = append(out[part], off)
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return slices.Concat(out...)
}

// checkIncreasing: every offset once, in order, from first (a stream's
// offsets may skip: not every chunk is messages).
func checkIncreasing(t *testing.T, all []int64, first int64) {
	t.Helper()
	if len(all) == 0 || all[0] != first {
		t.Fatalf("read %d offsets, first %v, want from %d", len(all), all[:min(1, len(all))], first)
	}
	for i := 1; i < len(all); i++ {
		if all[i] <= all[i-1] {
			t.Fatalf("offset %d follows %d", all[i], all[i-1])
		}
	}
}

func publishN(t *testing.T, b *storeBundle, stream string, n int) {
	t.Helper()
	for i := range n {
		if err := b.pub.PublishWithContext(context.Background(), "", stream, false, false, amqp.Publishing{Body: []byte(fmt.Sprintf("m-%06d-%s", i, "padding-padding-padding"))}); err != nil {
			t.Fatal(err)
		}
		if i%500 == 499 || i == n-1 {
			for range i%500 + 1 {
				if c := <-b.conf; !c.Ack {
					t.Fatal("nacked")
				}
			}
		}
	}
}

// When retention has removed the start of a stream (its first offset is
// past half of its last), the two parts still read every offset that is
// left, once, in order.
func TestReadStreamPartsAfterRetentionRemovedTheStart(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	stream := b.env.Name("trunc")
	ch := b.env.Channel("trunc")
	if _, err := ch.QueueDeclare(stream, true, false, false, false, amqp.Table{"x-queue-type": "stream",
		"x-max-length-bytes": int64(60000), "x-stream-max-segment-size-bytes": int64(8000)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = b.env.Channel("trunc-cleanup").QueueDelete(stream, false, false, false) })
	publishN(t, b, stream, 3*splitFrom)
	one := readOffsets(t, b, stream, 1)
	if len(one) == 0 || one[0] <= 3*splitFrom/2 {
		t.Fatalf("retention left %d offsets from %v: the test needs the start removed past the half", len(one), one[:min(1, len(one))])
	}
	checkIncreasing(t, one, one[0])
	two := readOffsets(t, b, stream, 2)
	if !slices.Equal(one, two) {
		t.Fatalf("two parts read %d offsets (%d..%d), one consumer %d (%d..%d)", len(two), two[0], two[len(two)-1], len(one), one[0], one[len(one)-1])
	}
}
