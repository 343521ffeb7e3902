package quarantine

import (
	"context"
	"fmt"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// carryMargin is how long before its retention ends an open record is
// carried forward: a seventh of the retention, at most 24 h (a day of
// the default 14). The broker deletes a whole segment once its newest
// message is past x-max-age, so a record may go a little after its own
// retention but never before it; the margin only has to cover the
// refreshes that may fail or be missed meanwhile (a runtime down for a
// deploy, a broker alarm): with the default refresh a day is thousands
// of chances, and a short test retention still leaves several. The margin
// is not configurable: one number fewer to get wrong.
func carryMargin(retention time.Duration) time.Duration {
	return min(retention/7, 24*time.Hour)
}

// CarryForward stores again, with the same id and a new stored-at, each
// open record of snap whose stored-at is older than its quarantine's
// retention minus carryMargin, so that it is still there (and can be
// replayed) after retention deletes the segment that held it; readers
// keep the copy stored last (see Snapshot). One carried-forward event per
// quarantine names them, signed like every other event. A record first
// seen more than quarantine.max_open_age ago (its Seen time, which a copy
// keeps) is not carried: an aged-out event names it, once, and the
// dlxbridge_quarantine_aged_out_total metric counts it; it then expires
// with its segment, as RecordExpiries records. It returns how many it
// carried. The runtime calls it after each metrics refresh, on a snapshot
// read without payloads: each carried record's payload is read on its own.
// It takes no lock: two runtimes may carry a record twice, and readers
// keep one.
func (rp *Replayer) CarryForward(ctx context.Context, snap *Snapshot) (int, error) {
	now := rp.now()
	agedNamed := map[string]bool{}
	for _, e := range snap.Events {
		if e.Kind == EventAgedOut && !e.Ignored {
			for _, id := range e.IDs {
				agedNamed[id] = true
			}
		}
	}
	var carry []*Record
	aged := map[string][]ExpiredRecord{}
	for _, r := range snap.Records {
		if r.State != StateOpen && r.State != StateExpired {
			continue // replayed or purged: nothing to keep
		}
		qc, ok := rp.Config.QueueByName(r.Queue)
		if !ok {
			continue
		}
		retention := qc.Quarantine.Retention
		if retention <= 0 || now.Sub(r.StoredAt) <= retention-carryMargin(retention) {
			continue
		}
		if maxAge := qc.Quarantine.MaxOpenAge; maxAge > 0 && now.Sub(r.Seen()) > maxAge {
			if !agedNamed[r.ID] {
				aged[r.Intake] = append(aged[r.Intake], ExpiredRecord{ID: r.ID, Queue: r.Queue,
					Class: string(r.Envelope.Class), Fingerprint: r.Envelope.Fingerprint, Owner: r.Owner, Seen: r.Seen()})
			}
			continue
		}
		carry = append(carry, r)
	}
	if len(carry) == 0 && len(aged) == 0 {
		return 0, nil
	}
	pub, err := amqpx.NewPublisher(rp.Conn)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	in := &Inspector{Conn: rp.Conn, Config: rp.Config}
	by, run := rp.by(), newRun()
	carried := map[string][]string{}
	n := 0
	var carryErr error
	for _, r := range carry {
		if err := rp.carry(ctx, in, pub, r, now); err != nil {
			carryErr = fmt.Errorf("carry %s forward: %w", r.ID, err)
			break
		}
		r.State = StateOpen // this snapshot's RecordExpiries must not name it
		carried[r.Intake] = append(carried[r.Intake], r.ID)
		n++
	}
	// The event follows the copies: a crash in between leaves a copy and no
	// event, and the next refresh finds nothing to carry (the copy is new).
	err = eachChunk(carried, func(intake string, ids []string) error {
		e := Event{Kind: EventCarriedForward, At: now.UTC(), By: by, Run: run, IDs: ids,
			Reason: "open and near its quarantine's retention: stored again with the same id, so that it outlives its segment",
			Counts: map[string]int{"carried_forward": len(ids)}}
		return publishEvent(ctx, pub, rp.Signer, intakeEvents(rp.Config, intake), e)
	})
	if err != nil {
		return n, fmt.Errorf("carry forward: %w", err)
	}
	err = eachChunk(aged, func(intake string, chunk []ExpiredRecord) error {
		ids := make([]string, len(chunk))
		for i, x := range chunk {
			ids[i] = x.ID
		}
		e := Event{Kind: EventAgedOut, At: now.UTC(), By: by, Run: run, IDs: ids, Expired: chunk,
			Reason: "open past quarantine.max_open_age: no longer carried forward; it expires with its segment",
			Counts: map[string]int{"aged_out": len(ids)}}
		if err := publishEvent(ctx, pub, rp.Signer, intakeEvents(rp.Config, intake), e); err != nil {
			return err
		}
		for _, x := range chunk {
			rp.Metrics.agedOutOne(x.Queue, x.Class)
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("aged out: %w", err)
	}
	return n, carryErr
}

// carry stores r again in its records stream: its meta with a new
// stored-at, its headers as stored and its payload (read from the stream
// at r's offset). Its Seen time is kept: an envelope without a time gets
// the first copy's, so that max_open_age counts from the first.
func (rp *Replayer) carry(ctx context.Context, in *Inspector, pub *amqpx.Publisher, r *Record, now time.Time) error {
	body := r.Body
	if body == nil {
		var err error
		if body, err = in.ReadBody(ctx, r); err != nil {
			return err
		}
	}
	env := r.Envelope
	if env.QuarantinedAt.IsZero() {
		env.QuarantinedAt = r.Seen()
	}
	var stream string
	for _, s := range in.quarantines() {
		if s.cfg.Quarantine.Queue == r.Intake {
			stream = s.cfg.Quarantine.RecordsStream()
		}
	}
	m := &recordMeta{ID: r.ID, Intake: r.Intake, StoredAt: now.UTC(), Exchange: r.Exchange, RoutingKey: r.RoutingKey,
		Props: r.Properties, Envelope: &env, Redrives: r.Redrives, Version: r.version}
	return pub.Publish(ctx, "", stream, recordPublishing(m, r.rawHeaders, body))
}
