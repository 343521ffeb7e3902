package consumer

import (
	"crypto/rand"
	"fmt"
	"os"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// signedHeaders are the headers the runtime signs and trusts only under a
// valid signature (see triage.SignedHeaders).
var signedHeaders = triage.SignedHeaders()

// newSigner loads the signing key: Config.SigningKey, else the environment
// variable the config file names, else a random key for this process only
// (random true).
func newSigner(cfg *Config) (s *triage.Signer, random bool, err error) {
	key := cfg.SigningKey
	env := cfg.File.Security.SigningKeyEnv
	if key == nil && env != "" {
		key = []byte(os.Getenv(env))
	}
	if len(key) == 0 {
		random = true
		key = make([]byte, 32)
		_, _ = rand.Read(key)
		cfg.Logger.Warn("no signing key: $"+env+" is unset, so this process signs its retry headers with a random key of its own. "+
			"Retries in flight are not trusted after a restart, nor by another consumer process: their attempt count and time budget start over; "+
			"quarantine envelopes are recorded as unverified claims (marked ?): no process can check another's signature; "+
			"nor are the quarantine's events checked: anyone who may publish to amq.default can mark records replayed or purged. "+
			"Set the same key (at least 16 random bytes) in $"+env+" for every consumer of these queues.",
			"component", "dlxbridge.consumer")
	}
	s, err = triage.NewSigner(key)
	if err != nil {
		return nil, false, fmt.Errorf("signing key ($%s or consumer.Config.SigningKey): %w", env, err)
	}
	return s, random, nil
}

// keeperVerifier is the signer the quarantine keeper verifies envelopes
// with: none when the key is this process's own random one. Such a key
// cannot check what another process (or this one before a restart)
// signed, and a failed check would read a genuine envelope as the broker's
// dead letter, dropping its class; with none, the keeper keeps each
// envelope as a claim, marked unverified, as a keeper without a key does.
// Replay verifies again with its own key before it signs anything.
func keeperVerifier(s *triage.Signer, random bool) *triage.Signer {
	if random {
		return nil
	}
	return s
}

// carriesCounts reports whether a broker may carry a delivery count (and the
// redelivered flag) across dead-lettering: 4.0.5 does, 3.10.8 does not (see
// docs/topology.md); 3.13 introduced the message container that 4.x builds
// on and is treated like 4.x, which costs at most one re-admission.
func carriesCounts(v topology.BrokerVersion) bool { return v.AtLeast(3, 13) }

// subject is what the bridge's signature on d, from work queue queue, is
// bound to.
func subject(queue string, d *amqp.Delivery) triage.Subject {
	return triage.Subject{Queue: queue, MessageID: d.MessageId, Body: d.Body}
}

// verify checks the bridge's signature on d. Bridge headers present without
// a valid one are noted (CountAttempts notes the attempt headers).
func (qr *queueRuntime) verify(d *amqp.Delivery) (triage.Verification, []string) {
	v := qr.deps.signer.Verify(subject(qr.cfg.Name, d), d.Headers, signedHeaders)
	if v.Valid {
		return v, nil
	}
	var ignored, notes []string
	for _, k := range signedHeaders {
		switch _, present := d.Headers[k]; {
		case !present, k == wire.HeaderAttempts, k == wire.HeaderFirstFailureAt:
		case k == wire.HeaderOriginalExchange, k == wire.HeaderOriginalRoutingKey, k == wire.HeaderOriginalQueue:
		default:
			ignored = append(ignored, k)
		}
	}
	if n := unverifiedOrigin(d.Headers, v.Problem); n != "" {
		notes = append(notes, n)
	}
	if len(ignored) > 0 {
		notes = append(notes, fmt.Sprintf("%s ignored: %s", strings.Join(ignored, ", "), v.Problem))
	}
	return v, notes
}

// maxClaimBytes caps each claimed origin value quoted in a note.
const maxClaimBytes = 256

// unverifiedOrigin is the note for origin headers (where the message was
// first published) that no valid signature vouches for, or "" when there
// are none. The usual cause is a replay run without the consumers' signing
// key, not a forgery, so the note says what was claimed and that it was not
// verified; the origin recorded is then this delivery's (see origin). The
// claim stays in the quarantine envelope through this note. Values are the
// publisher's: quoted, cut, never used.
func unverifiedOrigin(h amqp.Table, problem string) string {
	var claim []string
	for _, f := range []struct{ name, key string }{
		{"exchange", wire.HeaderOriginalExchange},
		{"routing key", wire.HeaderOriginalRoutingKey},
		{"queue", wire.HeaderOriginalQueue},
	} {
		raw, present := h[f.key]
		if !present {
			continue
		}
		s, ok := wireval.String(raw)
		if !ok {
			s = "(" + wireval.TypeName(raw) + ")"
		}
		// The header's name too: an operator greps for it.
		claim = append(claim, fmt.Sprintf("%s %q (%s)", f.name, frame.Truncate(s, maxClaimBytes), f.key))
	}
	if len(claim) == 0 {
		return ""
	}
	who, why := "the message claimed", problem
	if _, replayed := h[wire.HeaderRedriveCount]; replayed {
		who = "a replay claimed"
		why += "; replay with the consumers' signing key (security.signing_key_env) to keep it"
	}
	return fmt.Sprintf("origin not verified: %s %s (%s); the recorded origin is where this delivery came from",
		who, strings.Join(claim, ", "), why)
}

// priorNotes are the notes an earlier hop recorded, if its signature vouches
// for them (signed): unsigned ones were written by someone else.
func priorNotes(d *amqp.Delivery, signed bool) []string {
	if !signed {
		return nil
	}
	notes, _ := wireval.StringList(d.Headers[wire.HeaderNotes])
	return notes
}

// mergeNotes appends the lists, dropping exact repeats (a note carried
// through several hops is recorded once).
func mergeNotes(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, n := range l {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}
