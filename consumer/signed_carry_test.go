package consumer

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A producer's value in a retry-signed header that the runtime does not
// set itself must not travel under the runtime's signature: a string would
// be signed as the bridge's own state (a header is evidence, never a
// command), and any other type makes the signature fail closed when the
// copy comes back, so its attempts count as 0 and a failing message is
// retried for ever.
func TestRetryAndReadmitSignOnlyTheirOwnState(t *testing.T) {
	t.Parallel()
	odd := map[string]any{
		"table":  amqp.Table{"a": "b"},
		"array":  []any{"x"},
		"bool":   true,
		"float":  1.5,
		"void":   nil,
		"time":   time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC),
		"string": "forged",
	}
	for name, v := range odd {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newSettleBundle(t, frame.DefaultFrameSize)
			signer, _ := triage.NewSigner(b.key)
			readmit := failure{verdict: triage.Verdict{Action: triage.ActionReadmit, Class: triage.ClassCrashLoop, Reason: "re-admitted"}}
			for _, c := range []struct {
				what, header string
				f            failure
			}{
				{"retry", wire.HeaderReadmitted, retryFailure()},
				{"readmit", wire.HeaderFirstFailureAt, readmit}, // no first failure known
			} {
				d := delivery()
				d.Headers[c.header] = v
				got, err := build(b.input(d, c.f))
				if err != nil {
					t.Fatal(err)
				}
				if r := signer.Verify(subject(settleQueue, d), got.p.Headers, signedHeaders); !r.Valid {
					t.Errorf("%s: the copy's signature does not verify (%s): its attempts would count as 0", c.what, r.Problem)
				}
				if got, ok := got.p.Headers[c.header]; ok {
					t.Errorf("%s: the producer's %s %#v is carried under the runtime's signature", c.what, c.header, got)
				}
			}
		})
	}
}
