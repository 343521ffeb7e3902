package quarantine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/triage"
)

// The oldest open record's age grows at every scrape, not only at every
// refresh; a queue whose records are all resolved reports 0; arrivals of
// every state are counted by class.
func TestMetricsOldestOpenAgeGrowsBetweenRefreshes(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	now := t0
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.oldest.now = func() time.Time { return now }
	rec := func(queue, class string, state State, at time.Time) *Record {
		return &Record{Queue: queue, State: state, Envelope: Envelope{Class: triage.Class(class), QuarantinedAt: at}}
	}
	m.Observe(&Snapshot{At: t0, Records: []*Record{
		rec("orders", "schema", StateOpen, t0.Add(-30*time.Second)),
		rec("orders", "schema", StateOpen, t0.Add(-90*time.Second)),
		rec("orders", "permanent", StateReplayed, t0.Add(-300*time.Second)),
		rec("mail", "transient", StatePurged, t0.Add(-60*time.Second)),
	}})
	head := "# HELP dlxbridge_quarantine_oldest_open_age_seconds Age of the oldest open quarantine record (0 when none is open), by work queue.\n" +
		"# TYPE dlxbridge_quarantine_oldest_open_age_seconds gauge\n" +
		"dlxbridge_quarantine_oldest_open_age_seconds{queue=\"mail\"} 0\n"
	want := func(age string) {
		t.Helper()
		exp := head + "dlxbridge_quarantine_oldest_open_age_seconds{queue=\"orders\"} " + age + "\n"
		if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "dlxbridge_quarantine_oldest_open_age_seconds"); err != nil {
			t.Error(err)
		}
	}
	want("90")
	now = now.Add(time.Minute) // a scrape a minute later, no refresh between
	want("150")
	for _, c := range []struct {
		class, state string
		n            float64
	}{{"schema", "open", 2}, {"permanent", "replayed", 1}} {
		if got := testutil.ToFloat64(m.records.WithLabelValues("orders", c.class, c.state)); got != c.n {
			t.Errorf("records{orders,%s,%s} = %v, want %v", c.class, c.state, got, c.n)
		}
	}
}

// A keeper without the consumers' key keeps an envelope's class as the
// message claims it: a producer choosing a new class per message must not
// mint a new series per class (the replay counter is never reset). Classes
// the bridge and the broker never write are counted as "other".
func TestMetricsClassLabelIsBounded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var recs []*Record
	for i := range 50 {
		class := triage.Class("claimed-" + strings.Repeat("x", i))
		recs = append(recs, &Record{Queue: "orders", State: StateOpen, Envelope: Envelope{Class: class}})
		m.replayed("orders", string(class))
	}
	recs = append(recs, &Record{Queue: "orders", State: StateOpen, Envelope: Envelope{Class: triage.ClassSchema}})
	m.Observe(&Snapshot{Records: recs})
	if n := testutil.CollectAndCount(m.records); n != 2 {
		t.Errorf("records: %d series, want 2 (schema, other)", n)
	}
	if n := testutil.CollectAndCount(m.replays); n != 1 {
		t.Errorf("replays: %d series, want 1 (other)", n)
	}
	if got := testutil.ToFloat64(m.records.WithLabelValues("orders", "other", "open")); got != 50 {
		t.Errorf("records{orders,other,open} = %v, want 50", got)
	}
}

// The class label reads triage's class list: every class triage gives,
// including one added later, is counted under its own label, not "other".
func TestMetricsLabelEveryTriageClass(t *testing.T) {
	t.Parallel()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var recs []*Record
	for _, c := range triage.Classes() {
		recs = append(recs, &Record{Queue: "orders", State: StateOpen, Envelope: Envelope{Class: c}})
		m.replayed("orders", string(c))
	}
	m.Observe(&Snapshot{Records: recs})
	for _, c := range triage.Classes() {
		if got := testutil.ToFloat64(m.records.WithLabelValues("orders", string(c), "open")); got != 1 {
			t.Errorf("records{orders,%s,open} = %v, want 1", c, got)
		}
		if got := testutil.ToFloat64(m.replays.WithLabelValues("orders", string(c))); got != 1 {
			t.Errorf("replays{orders,%s} = %v, want 1", c, got)
		}
	}
	if got := testutil.ToFloat64(m.records.WithLabelValues("orders", "other", "open")); got != 0 {
		t.Errorf("records{orders,other,open} = %v, want 0", got)
	}
}

// A record a keeper stores counts as open at once, before any refresh; a
// refresh whose snapshot was read before the record was written keeps it
// counted; one that shows it counts it once; a record written twice (a
// keeper restarted before its ack) counts once.
func TestMetricsCountStoredRecordsAtOnce(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	open := func() float64 { return testutil.ToFloat64(m.records.WithLabelValues("orders", "schema", "open")) }
	r := &Record{ID: "a", Queue: "orders", Envelope: Envelope{Class: triage.ClassSchema, QuarantinedAt: t0}}
	m.stored(r, t0)
	m.stored(r, t0)
	if got := open(); got != 1 {
		t.Fatalf("open after a store: %v, want 1", got)
	}
	m.Observe(&Snapshot{At: t0.Add(time.Second)}) // read before the record was written
	if got := open(); got != 1 {
		t.Fatalf("open after a stale refresh: %v, want 1 (the stored record is kept counted)", got)
	}
	r.State = StateOpen
	m.Observe(&Snapshot{At: t0.Add(2 * time.Second), Records: []*Record{r}})
	if got := open(); got != 1 {
		t.Fatalf("open after a refresh that shows it: %v, want 1", got)
	}
	m.Observe(&Snapshot{At: t0.Add(3 * time.Second)}) // now gone (purged by hand, say)
	if got := open(); got != 0 {
		t.Fatalf("open after it left the stream: %v, want 0", got)
	}
	m.stored(&Record{ID: "b", Queue: "orders", Envelope: Envelope{Class: triage.ClassSchema}}, t0)
	m.Observe(&Snapshot{At: t0.Add(freshFor + time.Minute)})
	if got := open(); got != 0 {
		t.Fatalf("a stored record no snapshot ever showed is still counted after %s: %v", freshFor, got)
	}
}

// The runtime's keeper counts what it stores in the open-records gauge at
// once: the first dead letter of an incident does not wait for a refresh.
func TestKeeperCountsRecordsAsItStoresThem(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	b.publish(b.q.Quarantine.Queue, amqp.Publishing{MessageId: "m-1", Type: "test.job",
		Headers: envelopeHeaders(b.q.Name, "fp-1", "bad", now), Body: []byte(`{"n":1}`)})
	kept := make(chan string, 1)
	k := &Keeper{Consume: b.env.Dial("keeper"), Publish: b.env.Dial("keeper-pub"), Metrics: m, Config: b.cfg,
		Intake: b.q.Quarantine.Queue, Records: b.q.Quarantine.RecordsStream(), kept: func(id string) { kept <- id }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("keeper: %v", err)
		}
	}()
	select {
	case <-kept:
	case err := <-done:
		done <- err
		t.Fatalf("keeper stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the keeper stored nothing within 30s")
	}
	var open float64
	for _, c := range triage.Classes() {
		open += testutil.ToFloat64(m.records.WithLabelValues(b.q.Name, string(c), "open"))
	}
	if open != 1 {
		t.Errorf("open records of %s right after the keeper stored one: %v, want 1 (no refresh ran)", b.q.Name, open)
	}
}
