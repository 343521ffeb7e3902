package quarantine

import (
	"context"
	"fmt"
	"strings"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// PurgeOptions say what to purge.
type PurgeOptions struct {
	// Filter selects records; it must have a selector. States default to
	// open and expired.
	Filter Filter
	// Reason is required; it is recorded in the audit trail.
	Reason string
	// DryRun lists what would be purged.
	DryRun bool
	// Max caps how many are purged (0: no cap).
	Max int
}

// PurgeResult is what a purge did (or would do).
type PurgeResult struct {
	Run      string   `json:"run"`
	DryRun   bool     `json:"dry_run"`
	Selected int      `json:"selected"`
	Purged   []string `json:"purged"`
}

// purgeChunk bounds the ids of one purged event.
const purgeChunk = 1000

// Purge marks the selected records resolved without sending them: a
// "purged" event per quarantine (per thousand records) names them, with
// who, when and why. The records themselves stay in the stream until
// retention removes them; every reader treats them as purged.
func (rp *Replayer) Purge(ctx context.Context, opts PurgeOptions) (*PurgeResult, error) {
	if !opts.Filter.HasSelector() {
		return nil, ErrNoSelector
	}
	if strings.TrimSpace(opts.Reason) == "" {
		return nil, ErrNoReason
	}
	if len(opts.Filter.States) == 0 {
		opts.Filter.States = []State{StateOpen, StateExpired}
	}
	filter := opts.Filter.String() // every event of the run names it
	res := &PurgeResult{Run: newRun(), DryRun: opts.DryRun, Purged: []string{}}
	selected, _, release, err := rp.selectLocked(ctx, opts.Filter, nil, nil, opts.DryRun,
		Event{Run: res.Run, Reason: opts.Reason, Filter: filter})
	if err != nil {
		return nil, err
	}
	defer release()
	res.Selected = len(selected)
	if opts.Max > 0 && len(selected) > opts.Max {
		selected = selected[:opts.Max]
	}
	if opts.DryRun {
		for _, r := range selected {
			res.Purged = append(res.Purged, r.ID)
		}
		return res, nil
	}
	pub, err := amqpx.NewPublisher(rp.Conn)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	byIntake := map[string][]*Record{}
	for _, r := range selected {
		byIntake[r.Intake] = append(byIntake[r.Intake], r)
	}
	by := rp.by()
	err = eachChunk(byIntake, func(intake string, chunk []*Record) error {
		ids := make([]string, len(chunk))
		for i, r := range chunk {
			ids[i] = r.ID
		}
		e := Event{Kind: EventPurged, At: rp.now().UTC(), By: by, Reason: opts.Reason, Run: res.Run,
			Filter: filter, IDs: ids, Counts: map[string]int{"selected": res.Selected, "purged": len(ids)}}
		if err := publishEvent(context.WithoutCancel(ctx), pub, rp.Signer, intakeEvents(rp.Config, intake), e); err != nil {
			return err
		}
		res.Purged = append(res.Purged, ids...)
		for _, r := range chunk {
			rp.Metrics.purged(r.Queue, string(r.Envelope.Class))
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	return res, nil
}

// RecordExpiries writes an expired event for each record of snap that is
// expired (past its quarantine's retention, unresolved) and that no expired
// event names yet, one event per quarantine and per thousand records, and
// returns how many it named. The event keeps each record's queue, class,
// fingerprint and owner, so that Stats and the metrics still count it as
// expired after the broker's retention has deleted the record (see
// Snapshot.Gone). The runtime calls it after each metrics refresh. It takes
// no lock: two runtimes may name a record twice, and readers count each id
// once.
//
// A Replayer also remembers the records it named (those still in the
// stream), so that a refresh whose read of the events stream stopped
// before its own expired events (see readStream) does not name them all
// again.
func (rp *Replayer) RecordExpiries(ctx context.Context, snap *Snapshot) (int, error) {
	rp.expiryMu.Lock()
	defer rp.expiryMu.Unlock()
	byIntake := map[string][]ExpiredRecord{}
	named := map[string]bool{} // what this Replayer named that is still in the stream, and will name now
	for _, r := range snap.Records {
		if r.State != StateExpired || snap.expiredNamed[r.ID] {
			continue
		}
		if rp.expiryNamed[r.ID] {
			named[r.ID] = true
			continue
		}
		byIntake[r.Intake] = append(byIntake[r.Intake], ExpiredRecord{ID: r.ID, Queue: r.Queue,
			Class: string(r.Envelope.Class), Fingerprint: r.Envelope.Fingerprint, Owner: r.Owner, Seen: r.Seen()})
	}
	rp.expiryNamed = named
	if len(byIntake) == 0 {
		return 0, nil
	}
	pub, err := amqpx.NewPublisher(rp.Conn)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	by, run, count := rp.by(), newRun(), 0
	err = eachChunk(byIntake, func(intake string, chunk []ExpiredRecord) error {
		ids := make([]string, len(chunk))
		for i, x := range chunk {
			ids[i] = x.ID
		}
		e := Event{Kind: EventExpired, At: rp.now().UTC(), By: by, Run: run, IDs: ids, Expired: chunk,
			Reason: "older than the quarantine's retention and never replayed or purged", Counts: map[string]int{"expired": len(ids)}}
		if err := publishEvent(ctx, pub, rp.Signer, intakeEvents(rp.Config, intake), e); err != nil {
			return fmt.Errorf("record expiries: %w", err)
		}
		count += len(ids)
		for _, x := range chunk {
			named[x.ID] = true
			rp.Metrics.expired(x.Queue, x.Class)
		}
		return nil
	})
	return count, err
}

// StartSigning writes a signing-started event, signed with rp.Signer, into
// each events stream of snap in which no event verified, and returns how
// many it wrote. Until a stream holds a signed event, a reader with the key
// counts its unsigned events, as an older version wrote them (see
// Event.Ignored); from that event on it ignores them, so a writer with the
// key should mark the point at once rather than at the first replay or
// purge. snap must have been read by an Inspector whose Verifier has
// rp.Signer's key; without a Signer, or for a snap read without a
// Verifier, it writes nothing. The runtime calls it after each metrics
// refresh, with its configured key only (a random key of its own verifies
// nobody else's events).
func (rp *Replayer) StartSigning(ctx context.Context, snap *Snapshot) (int, error) {
	if rp.Signer == nil || len(snap.unsigned) == 0 {
		return 0, nil
	}
	pub, err := amqpx.NewPublisher(rp.Conn)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	e := Event{Kind: EventSigningStarted, At: rp.now().UTC(), By: rp.by(), Run: newRun(),
		Reason: "from here on, a reader with the signing key lets only signed events change records in this stream"}
	for i, stream := range snap.unsigned {
		if err := publishEvent(ctx, pub, rp.Signer, stream, e); err != nil {
			return i, fmt.Errorf("start signing %s: %w", stream, err)
		}
	}
	return len(snap.unsigned), nil
}
