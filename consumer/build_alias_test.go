package consumer

import (
	"fmt"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A retry and a re-admission assemble their headers in place, in one table
// of their own; the quarantine record in a redacted copy. None may write
// into the delivery's table or the tables nested in it, which the copy
// shares: the delivery stays unsettled until the copy is confirmed, and a
// requeue after a failed publish, a second copy (a retry parked in the
// quarantine, a re-send), the log and OnSettled read it as received.
// Each copy is built twice, once in a frame so small that fitting cuts the
// producer's headers; the copy's own table is then written into (its
// nested tables are the delivery's, shared: no code writes into those).
func TestBuildingACopyLeavesTheDeliveryAsReceived(t *testing.T) {
	t.Parallel()
	readmit := failure{verdict: triage.Verdict{Action: triage.ActionReadmit, Class: triage.ClassCrashLoop, Reason: "re-admitted"}}
	for _, frameMax := range []int{frame.DefaultFrameSize, 4096} {
		b := newSettleBundle(t, frameMax)
		for name, f := range map[string]failure{"retry": retryFailure(), "readmit": readmit, "quarantine": quarantineFailure()} {
			d := delivery()
			d.Headers["nested"] = amqp.Table{"deep": amqp.Table{"k": "v"}, "arr": []any{"a", amqp.Table{"in": int32(1)}}}
			d.Headers[wire.HeaderDropped] = `["x-forged"]`
			d.Headers[wire.HeaderNotes] = `["forged note"]`
			d.Headers["secret"] = amqp.Table{"secret": "nested s3cr3t"}
			d.Headers[wire.HeaderCC] = []any{"payments"}
			if frameMax == 4096 {
				d.Headers["x-big"] = strings.Repeat("b", 3000)
			}
			before := fmt.Sprintf("%#v", d.Headers)
			got, err := build(b.input(d, f))
			if after := fmt.Sprintf("%#v", d.Headers); after != before {
				t.Fatalf("%s, frame %d (err %v): building the copy changed the delivery's headers:\nbefore %s\nafter  %s", name, frameMax, err, before, after)
			}
			if err != nil {
				continue // a retry that cannot fit: it is parked instead, from the same delivery
			}
			for k := range got.p.Headers {
				got.p.Headers[k] = "overwritten"
			}
			got.p.Headers["added"] = true
			if after := fmt.Sprintf("%#v", d.Headers); after != before {
				t.Fatalf("%s, frame %d: writing into the copy changed the delivery's headers:\nbefore %s\nafter  %s", name, frameMax, before, after)
			}
		}
	}
}
