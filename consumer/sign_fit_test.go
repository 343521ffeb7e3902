package consumer

import (
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A retry that fitting trims (a producer's tracestate dropped, the error
// text cut, a note added: the notes are signed) is signed after the trim:
// its next delivery is trusted, and its attempts go on from the signed
// count rather than starting over or being noted as forged. Likewise a
// re-admission. The signature is then exactly the room the placeholder
// kept: the frame fits.
func TestRetryTrimmedByFittingIsTrustedOnItsNextDelivery(t *testing.T) {
	t.Parallel()
	const frameMax = 4096
	b := newSettleBundle(t, frameMax)
	for _, f := range []failure{retryFailure(), {verdict: triage.Verdict{Action: triage.ActionReadmit, Class: triage.ClassCrashLoop, Reason: "re-admitted"}}} {
		d := delivery()
		d.Headers[wire.HeaderTracestate] = "k=" + strings.Repeat("v", 3800)
		if f.verdict.Action == triage.ActionRetry {
			f.err = errors.New("downstream busy: " + strings.Repeat("e", 1500))
		}
		got, err := build(b.input(d, f))
		if err != nil {
			t.Fatalf("%s: %v", f.verdict.Action, err)
		}
		if len(got.changed) == 0 {
			t.Fatalf("%s: nothing was trimmed: the test does not exercise fitting", f.verdict.Action)
		}
		if n := frame.HeaderFrameSize(&got.p); n > frameMax {
			t.Errorf("%s: frame %d bytes after signing, frame_max %d", f.verdict.Action, n, frameMax)
		}
		notes, _ := wireval.StringList(got.p.Headers[wire.HeaderNotes])
		if !strings.Contains(strings.Join(notes, " "), wire.HeaderTracestate) {
			t.Errorf("%s: notes %q do not record the trim", f.verdict.Action, notes)
		}
		// The copy comes back as a new delivery of the work queue.
		next := &amqp.Delivery{MessageId: got.p.MessageId, Body: got.p.Body, Headers: got.p.Headers}
		sig, sigNotes := b.w.q.verify(next)
		if !sig.Valid || len(sigNotes) > 0 {
			t.Fatalf("%s: the trimmed copy is not trusted: %s %v", f.verdict.Action, sig.Problem, sigNotes)
		}
		a := triage.CountAttempts(triage.AttemptInput{Headers: next.Headers, Signature: sig})
		if want := int(f.verdict.Attempt); a.Failed != want || !a.Signed {
			t.Errorf("%s: next delivery counts %d failed attempts (signed %v), want %d: notes %v", f.verdict.Action, a.Failed, a.Signed, want, a.Notes)
		}
	}
}
