package quarantine

import (
	"context"
	"encoding/json"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

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
	res := &PurgeResult{Run: newRun(), DryRun: opts.DryRun, Purged: []string{}}
	selected, release, err := rp.selectLocked(ctx, opts.Filter, opts.DryRun,
		Event{Run: res.Run, Reason: opts.Reason, Filter: opts.Filter.String()})
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
	for _, intake := range sortedKeysRecords(byIntake) {
		recs := byIntake[intake]
		for from := 0; from < len(recs); from += purgeChunk {
			chunk := recs[from:min(from+purgeChunk, len(recs))]
			ids := make([]string, len(chunk))
			for i, r := range chunk {
				ids[i] = r.ID
			}
			e := Event{Kind: EventPurged, At: rp.now().UTC(), By: by, Reason: opts.Reason, Run: res.Run,
				Filter: opts.Filter.String(), IDs: ids, Counts: map[string]int{"selected": res.Selected, "purged": len(ids)}}
			b, _ := json.Marshal(e)
			if err := pub.Publish(context.WithoutCancel(ctx), "", intakeEvents(rp.Config, intake),
				amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: b}); err != nil {
				return res, err
			}
			res.Purged = append(res.Purged, ids...)
			for _, r := range chunk {
				rp.Metrics.purged(r.Queue, string(r.Envelope.Class))
			}
		}
	}
	return res, nil
}

func sortedKeysRecords(m map[string][]*Record) []string {
	out := make(map[string][]string, len(m))
	for k := range m {
		out[k] = nil
	}
	return sortedKeys(out)
}
