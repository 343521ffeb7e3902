package quarantine

import (
	"fmt"
	"math"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A message's redrive count (wire.HeaderRedriveCount) is how many times it
// was replayed out of a quarantine; replay refuses it at the queue's
// max_redrives. A producer can set the header on a new message, so a
// reader with the consumers' key trusts it only when a signature vouches
// for it:
//   - the replay's redrive signature (wire.HeaderRedriveSignature, see
//     triage.Signer.SignRedrive), over the count, the message id and the
//     body: it survives retries and the broker's own dead-lettering of the
//     replayed message, which change neither;
//   - or a valid envelope signature of version 2 or later, which covers the
//     count: the runtime keeps a count in its envelope only if it verified
//     it, and the envelope signature still vouches after redaction changed
//     the body.
//
// Any other count is the publisher's claim: the message has no prior
// replays, and a note keeps what it claimed.

// redrives reads the redrive count a message carries: 0 when absent,
// malformed or negative, and at most math.MaxInt32.
func redrives(h map[string]any) int {
	n, res := wireval.Int(h[wire.HeaderRedriveCount])
	if res != wireval.IntOK && res != wireval.IntOverflow || n < 0 {
		return 0
	}
	return int(min(n, math.MaxInt32))
}

// trustedRedrives returns the redrive count d carries if a signature made
// with v vouches for it (envelopeVerified: d's envelope signature was
// checked valid with v), else 0 and a note saying what was claimed and
// why it was not trusted ("" when d claims no count). d must be the
// message as it reached the intake (its message id and body are signed).
// With v nil nothing can be verified: the claimed count, and no note.
func trustedRedrives(d *amqp.Delivery, v *triage.Signer, envelopeVerified bool) (n int, note string) {
	h := map[string]any(d.Headers)
	if _, claimed := h[wire.HeaderRedriveCount]; !claimed || v == nil {
		return redrives(h), ""
	}
	if envelopeVerified && envelopeCoversRedrives(h) {
		return redrives(h), ""
	}
	res := v.VerifyRedrive(d.MessageId, d.Body, h)
	if res.Valid {
		return redrives(h), ""
	}
	return 0, unverifiedRedrives(h, res.Problem)
}

// unverifiedRedrives is the note for a redrive count no valid signature
// vouches for: what was claimed (quoted, cut, never used) and why it was
// not trusted (problem).
func unverifiedRedrives(h map[string]any, problem string) string {
	return fmt.Sprintf("redrive count not verified: the message claimed %q prior replays (%s) (%s); counted as none",
		claimText(h[wire.HeaderRedriveCount]), wire.HeaderRedriveCount, problem)
}
