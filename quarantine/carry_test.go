package quarantine

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dlxbridge/dlxbridge/config"
)

// A record older than its retention minus the margin is stored again with
// the same id: readers list it once, at the new copy's offset, open; a
// second pass carries nothing; a signed carried-forward event names it; and
// it can still be replayed. The clock is moved, not waited for: the
// broker deletes a segment only once it has rolled (500 MB by default),
// which a test does not wait for.
func TestCarryForwardKeepsAnOpenRecordOnceAndReplayable(t *testing.T) {
	t.Parallel()
	b := setupStore(t, func(q *config.Queue) { q.Quarantine.Retention = time.Hour })
	b.quarantineJobs(2, "fp-old", validJob)
	b.keep(2)
	key := envSigner(t, "the consumers' key, 32 bytes....")
	// Past retention minus the margin (1h/7 = 8m34s), before retention.
	later := time.Now().Add(time.Hour - 4*time.Minute)
	clock := func() time.Time { return later }
	in := &Inspector{Conn: b.env.Dial("inspector"), Config: b.cfg, Now: clock, OmitBodies: true, Verifier: key}
	before := b.snapshot(in)
	if len(before.Records) != 2 {
		t.Fatalf("%d records, want 2", len(before.Records))
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	rp := b.replayer()
	rp.Now, rp.Signer, rp.Metrics = clock, key, m
	n, err := rp.CarryForward(context.Background(), before)
	if err != nil || n != 2 {
		t.Fatalf("carried %d (%v), want 2", n, err)
	}
	after := b.snapshot(in)
	if len(after.Records) != 2 {
		t.Fatalf("after carrying: %d records, want 2 (one per id)", len(after.Records))
	}
	for i, r := range after.Records {
		old := before.Records[i]
		if r.ID != old.ID || r.Offset <= old.Offset || !r.StoredAt.Equal(later.UTC()) || r.State != StateOpen || !r.Seen().Equal(old.Seen()) {
			t.Fatalf("record %d: %s@%d stored %s %s seen %s; want %s past offset %d, stored %s, open, seen %s",
				i, r.ID, r.Offset, r.StoredAt, r.State, r.Seen(), old.ID, old.Offset, later.UTC(), old.Seen())
		}
		body, err := in.ReadBody(context.Background(), r)
		if err != nil || string(body) != validJob(i) {
			t.Fatalf("the copy's payload %q (%v), want %q", body, err, validJob(i))
		}
	}
	var carried *Event
	for i := range after.Events {
		if after.Events[i].Kind == EventCarriedForward {
			carried = &after.Events[i]
		}
	}
	if carried == nil || len(carried.IDs) != 2 || !carried.Verified {
		t.Fatalf("carried-forward event %+v, want a signed one naming 2", carried)
	}
	if n, err := rp.CarryForward(context.Background(), after); err != nil || n != 0 {
		t.Fatalf("a second pass carried %d (%v), want 0", n, err)
	}
	if got := testutil.CollectAndCount(m.agedOut); got != 0 {
		t.Fatalf("%d aged-out series with no max_open_age", got)
	}
	res, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Fingerprint: "fp-old"}, Reason: "after carrying"})
	if err != nil || len(res.Sent) != 2 {
		t.Fatalf("replay of the carried records: %v %+v", err, res)
	}
	if got := b.drain(b.q.Name, 2); len(got) != 2 {
		t.Fatalf("work queue got %d", len(got))
	}
}

// Past quarantine.max_open_age a record is not carried forward: an
// aged-out event names it and the metric counts it, once.
func TestPastMaxOpenAgeARecordAgesOutLoudly(t *testing.T) {
	t.Parallel()
	b := setupStore(t, func(q *config.Queue) {
		q.Quarantine.Retention = time.Hour
		q.Quarantine.MaxOpenAge = 30 * time.Minute
	})
	b.quarantineJobs(1, "fp-aged", validJob)
	b.keep(1)
	later := time.Now().Add(time.Hour - 4*time.Minute)
	clock := func() time.Time { return later }
	in := &Inspector{Conn: b.env.Dial("inspector"), Config: b.cfg, Now: clock, OmitBodies: true}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	rp := b.replayer()
	rp.Now, rp.Metrics = clock, m
	for pass := 0; pass < 2; pass++ {
		n, err := rp.CarryForward(context.Background(), b.snapshot(in))
		if err != nil || n != 0 {
			t.Fatalf("pass %d carried %d (%v), want 0", pass, n, err)
		}
	}
	if got := testutil.ToFloat64(m.agedOut.WithLabelValues(b.q.Name, "permanent")); got != 1 {
		t.Fatalf("aged_out_total %v, want 1", got)
	}
	snap := b.snapshot(in)
	if len(snap.Records) != 1 {
		t.Fatalf("%d records, want 1 (not copied)", len(snap.Records))
	}
	aged := 0
	for _, e := range snap.Events {
		if e.Kind == EventAgedOut {
			aged++
			if len(e.IDs) != 1 || e.IDs[0] != snap.Records[0].ID || len(e.Expired) != 1 || e.Expired[0].Queue != b.q.Name {
				t.Fatalf("aged-out event %+v", e)
			}
		}
	}
	if aged != 1 {
		t.Fatalf("%d aged-out events, want 1", aged)
	}
}
