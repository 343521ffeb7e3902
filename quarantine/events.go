package quarantine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A quarantine's events stream is its audit trail and the truth about its
// records' states: a replay or purge writes what it did there, confirmed,
// and a record is resolved by the replayed or purged event that names it.

// Event is one entry of a quarantine's events stream: what happened to
// records, by whom and why. It is also the audit trail.
type Event struct {
	// Kind is one of the Event* constants.
	Kind   string    `json:"kind"`
	At     time.Time `json:"at"`
	By     string    `json:"by"`
	Reason string    `json:"reason,omitempty"`
	// Run groups the events of one replay or purge.
	Run string `json:"run"`
	// Filter is the selection as the operator gave it.
	Filter string `json:"filter,omitempty"`
	// IDs are the records it is about.
	IDs     []string `json:"ids,omitempty"`
	ToQueue string   `json:"to_queue,omitempty"`
	// Patch is the repair a replay applied (Patch.String).
	Patch  string         `json:"patch,omitempty"`
	Counts map[string]int `json:"counts,omitempty"`
	// Expired are the records an expired event names, with their groups.
	Expired []ExpiredRecord `json:"expired,omitempty"`
	// Outcome is what became of the messages a replay-outcome event names
	// (IDs, their records) in the replay Run (JobHandled or
	// JobQuarantinedAgain).
	Outcome string `json:"outcome,omitempty"`
	// Stop says why a replay ended before it had sent everything (a
	// replay-finished event with the count stopped): cancelled, the
	// breaker reopened, failures returned.
	Stop string `json:"stop,omitempty"`
	// Window is the outage an outage-started or outage-ended event is
	// about; Windows the first of the outages an automatic redrive covers
	// (Counts["windows"]: how many; see PendingWindows).
	Window  *OutageWindow  `json:"window,omitempty"`
	Windows []OutageWindow `json:"windows,omitempty"`
	// Quarantine is the intake whose events stream holds the event, as
	// read (a replay of ids in no one queue claims every quarantine, so
	// one run's claimed event appears once per quarantine).
	Quarantine string `json:"quarantine,omitempty"`
	Offset     int64  `json:"-"`

	// Verified, Ignored and Unverified are what the reader made of the
	// event's signature (wire.HeaderEventSignature), never what its body
	// says: a writer leaves them unset.
	//
	// Verified: the signature verifies with the reader's key
	// (Inspector.Verifier).
	Verified bool `json:"verified,omitempty"`
	// Ignored: no valid signature, in a stream where a signed event
	// precedes it (see Replayer.StartSigning). It is listed, and changes no
	// record's state, names no expiry and ends no read. Only a reader with
	// a key ignores an event.
	Ignored bool `json:"ignored,omitempty"`
	// Unverified says why the event is not Verified and whether it
	// counted; "" when it is Verified.
	Unverified string `json:"unverified,omitempty"`
}

// ExpiredRecord is what an expired event keeps of a record, so that it can
// be counted in its group after the record itself is gone.
type ExpiredRecord struct {
	ID          string       `json:"id"`
	Queue       string       `json:"queue"`
	Class       string       `json:"class"`
	Fingerprint string       `json:"fingerprint,omitempty"`
	Owner       config.Owner `json:"owner"`
	Seen        time.Time    `json:"seen"`
}

// Event kinds. "replayed" and "purged" resolve the records they name.
const (
	EventReplayStarted  = "replay-started"
	EventReplayed       = "replayed"
	EventReplayFinished = "replay-finished"
	// EventReplayRefused ends a replay that claimed its quarantines and
	// then sent nothing because selected messages fail the current schema
	// (IDs names them).
	EventReplayRefused = "replay-refused"
	EventPurged        = "purged"
	// EventClaimed: a replay or purge took the quarantine's lock and reads
	// the events stream up to this event (its end, found without waiting).
	EventClaimed = "claimed"
	// EventExpired names records first seen past the retention, unresolved
	// (see Replayer.RecordExpiries). It does not resolve them: a purge
	// still may.
	EventExpired = "expired"
	// EventSigningStarted marks where an events stream's signed events
	// begin (see Replayer.StartSigning): after it, a reader with the key
	// ignores every event without a valid signature.
	EventSigningStarted = "signing-started"
	// EventCarriedForward names open records stored again, same id, before
	// retention deletes their segment (see Replayer.CarryForward).
	EventCarriedForward = "carried-forward"
	// EventAgedOut names open records past quarantine.max_open_age, which
	// are no longer carried forward and expire with their segment.
	EventAgedOut = "aged-out"
	// EventReplayOutcome: the runtime settled messages a replay sent
	// (Outcome, IDs: their records), signed with its key.
	EventReplayOutcome = "replay-outcome"
	// EventCancelRequested asks the running replay Run to stop after the
	// message in flight (quarantine jobs cancel).
	EventCancelRequested = "cancel-requested"
	// EventOutageStarted and EventOutageEnded bound a queue's outage
	// (Window): its breaker opened, and closed again.
	EventOutageStarted = "outage-started"
	EventOutageEnded   = "outage-ended"
)

// What a reader says about an event that is not Verified.
const (
	unverifiedNoKey = "not checked: read without the signing key (security.signing_key_env); counted"
	// unverifiedEarly and unverifiedLate follow the signature's problem.
	unverifiedEarly = "; no signed event precedes it in this stream (written by an older version, or before the key was set): counted"
	unverifiedLate  = "; a signed event precedes it in this stream: ignored"
)

// readEvents reads an events stream to its end, or, when mark is a run,
// up to and including that run's claimed event (with v, a signed one).
// With v (the key), each event's signature is checked (see settleEvents).
func readEvents(ctx context.Context, conn *amqp.Connection, stream string, waits streamWaits, mark string, v *triage.Signer) ([]Event, error) {
	var out []Event
	read := func(off int64, d *amqp.Delivery) error {
		var e Event
		if json.Unmarshal(d.Body, &e) != nil || e.Kind == "" {
			return nil // not an event this version writes
		}
		e.Offset = off
		e.Verified, e.Ignored, e.Unverified = false, false, unverifiedNoKey
		if v != nil {
			res := v.VerifyEvent(stream, d.Body, d.Headers)
			e.Verified, e.Unverified = res.Valid, res.Problem
		}
		out = append(out, e)
		if mark != "" && e.Kind == EventClaimed && e.Run == mark && (v == nil || e.Verified) {
			return errStopRead
		}
		return nil
	}
	var err error
	if mark != "" {
		err = consumeFrom(ctx, conn, stream, "first", read)
	} else {
		err = readStream(ctx, conn, stream, waits, read)
	}
	if v != nil {
		settleEvents(out)
	}
	return out, err
}

// settleEvents decides, for a reader with the key, which of one stream's
// events without a valid signature count. Before the stream's first
// signed event they do: an older version wrote them (or one without the
// key), and ignoring them would reopen every record they resolved, for a
// later replay to send again. After it they do not: from there on, every
// writer with the key signs, so an unsigned event is someone else's (a
// user who may publish through the default exchange) or a writer's
// without the key, and it is listed, marked, and changes nothing. Nobody
// can move that point earlier: it takes the key to sign.
func settleEvents(events []Event) {
	signed := false
	for i := range events {
		e := &events[i]
		switch {
		case e.Verified:
			signed = true
		case signed:
			e.Ignored = true
			e.Unverified += unverifiedLate
		default:
			e.Unverified += unverifiedEarly
		}
	}
}

// mergeEvents merges events streams into one list in time order, each
// stream's own order kept (its offsets are the truth; writers' clocks may
// disagree): of the streams' next events the earliest goes first.
func mergeEvents(streams [][]Event) []Event {
	n := 0
	for _, st := range streams {
		n += len(st)
	}
	out := make([]Event, 0, n)
	next := make([]int, len(streams))
	for len(out) < n {
		pick := -1
		for i, st := range streams {
			if next[i] < len(st) && (pick < 0 || st[next[i]].At.Before(streams[pick][next[pick]].At)) {
				pick = i
			}
		}
		out = append(out, streams[pick][next[pick]])
		next[pick]++
	}
	return out
}

// eachChunk calls fn for each intake of byIntake in name order, with its
// items in chunks of at most purgeChunk (one event each).
func eachChunk[T any](byIntake map[string][]T, fn func(intake string, chunk []T) error) error {
	for _, intake := range slices.Sorted(maps.Keys(byIntake)) {
		items := byIntake[intake]
		for from := 0; from < len(items); from += purgeChunk {
			if err := fn(intake, items[from:min(from+purgeChunk, len(items))]); err != nil {
				return err
			}
		}
	}
	return nil
}

// publishEvent writes e to an events stream, confirmed, signed with s (a
// nil s writes it unsigned).
func publishEvent(ctx context.Context, pub *amqpx.Publisher, s *triage.Signer, stream string, e Event) error {
	e.Verified, e.Ignored, e.Unverified = false, false, ""
	b, _ := json.Marshal(e)
	p := amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: b}
	if s != nil {
		p.Headers = amqp.Table{wire.HeaderEventSignature: s.SignEvent(stream, b)}
	}
	err := pub.Publish(ctx, "", stream, p)
	if errors.Is(err, amqpx.ErrUnroutable) {
		// Published to the default exchange: only a missing stream
		// returns it. Every other command that reads the stream says the
		// same.
		return fmt.Errorf("events stream %s does not exist (was the topology applied?): %w", stream, err)
	}
	return err
}
