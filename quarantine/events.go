package quarantine

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
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
	IDs     []string       `json:"ids,omitempty"`
	ToQueue string         `json:"to_queue,omitempty"`
	Counts  map[string]int `json:"counts,omitempty"`
	// Expired are the records an expired event names, with their groups.
	Expired []ExpiredRecord `json:"expired,omitempty"`
	// Quarantine is the intake whose events stream holds the event, as
	// read (a replay of ids in no one queue claims every quarantine, so
	// one run's claimed event appears once per quarantine).
	Quarantine string `json:"quarantine,omitempty"`
	Offset     int64  `json:"-"`
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
)

// readEvents reads an events stream to its end, or, when mark is a run,
// up to and including that run's claimed event.
func readEvents(ctx context.Context, conn *amqp.Connection, stream string, waits streamWaits, mark string) ([]Event, error) {
	var out []Event
	read := func(off int64, d *amqp.Delivery) error {
		var e Event
		if json.Unmarshal(d.Body, &e) != nil || e.Kind == "" {
			return nil // not an event this version writes
		}
		e.Offset = off
		out = append(out, e)
		if mark != "" && e.Kind == EventClaimed && e.Run == mark {
			return errStopRead
		}
		return nil
	}
	if mark != "" {
		return out, consumeFrom(ctx, conn, stream, "first", read)
	}
	return out, readStream(ctx, conn, stream, waits, read)
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

// publishEvent writes e to an events stream, confirmed.
func publishEvent(ctx context.Context, pub *amqpx.Publisher, stream string, e Event) error {
	b, _ := json.Marshal(e)
	return pub.Publish(ctx, "", stream, amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: b})
}
