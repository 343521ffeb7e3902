package quarantine

import (
	"context"
	"slices"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Reading a stream in parts returns every offset once, in order within
// each part, the parts consecutive: the same as one consumer's read.
func TestReadStreamPartsCoverEveryOffsetOnce(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	stream := b.q.Quarantine.RecordsStream()
	const n = splitFrom + 1000
	for i := range n {
		if err := b.pub.PublishWithContext(context.Background(), "", stream, false, false, amqp.Publishing{Body: []byte{byte(i)}}); err != nil {
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
	conn := b.env.Dial("reader")
	read := func(parts int) [][]int64 {
		out := make([][]int64, parts)
		err := readStreamParts(context.Background(), conn, stream, streamWaits{}, parts, func(part int, off int64, _ *amqp.Delivery) error {
			out[part] = append(out[part], off)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	one := read(1)[0]
	if len(one) != n || !slices.IsSorted(one) {
		t.Fatalf("one consumer read %d offsets (sorted: %v), want %d", len(one), slices.IsSorted(one), n)
	}
	for _, parts := range []int{2, 3} {
		got := read(parts)
		for i, p := range got {
			if len(p) == 0 {
				t.Errorf("%d parts: part %d read nothing", parts, i)
			}
		}
		if all := slices.Concat(got...); !slices.Equal(all, one) {
			t.Fatalf("%d parts read %d offsets, not the %d of one consumer in order", parts, len(all), len(one))
		}
	}
}
