package quarantine

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Metrics are the quarantine's Prometheus collectors, registered on the
// registerer given to NewMetrics (none if nil). Observe sets the gauges
// from an Inspector snapshot; a Replayer with Metrics counts what it
// replays and purges. A nil *Metrics does nothing.
type Metrics struct {
	// mu orders Observe's rebuild of the gauges against stored's counts.
	mu sync.Mutex
	// fresh are the records a keeper of this process stored since they
	// last showed in a snapshot: counted at once, and kept counted by an
	// Observe whose snapshot was read before they were written.
	fresh   map[string]freshRecord
	records *prometheus.GaugeVec
	oldest  *oldestOpen
	intake  *prometheus.GaugeVec
	replays *prometheus.CounterVec
	purges  *prometheus.CounterVec
	expires *prometheus.CounterVec
	agedOut *prometheus.CounterVec
}

// NewMetrics makes the collectors and registers them on reg (if not nil):
//
//	dlxbridge_quarantine_records{queue,class,state}
//	dlxbridge_quarantine_oldest_open_age_seconds{queue}
//	dlxbridge_quarantine_intake_waiting{intake}
//	dlxbridge_quarantine_replays_total{queue,class}
//	dlxbridge_quarantine_purges_total{queue,class}
//	dlxbridge_quarantine_expiries_total{queue,class}
//	dlxbridge_quarantine_aged_out_total{queue,class}
//
// Records count by state (open, replayed, purged, expired), so arrivals and
// expiries are never silent. The oldest open age is computed at each scrape
// from the last snapshot, so it grows between refreshes; expiries count the
// records this process first named in an expired event
// (Replayer.RecordExpiries).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		records: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dlxbridge_quarantine_records",
			Help: "Quarantine records by queue, failure class and state (open, replayed, purged, expired)."}, []string{"queue", "class", "state"}),
		oldest: &oldestOpen{now: time.Now, desc: prometheus.NewDesc("dlxbridge_quarantine_oldest_open_age_seconds",
			"Age of the oldest open quarantine record (0 when none is open), by work queue.", []string{"queue"}, nil)},
		intake: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dlxbridge_quarantine_intake_waiting",
			Help: "Messages in a quarantine intake not yet stored as records."}, []string{"intake"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dlxbridge_quarantine_replays_total",
			Help: "Quarantine records replayed."}, []string{"queue", "class"}),
		purges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dlxbridge_quarantine_purges_total",
			Help: "Quarantine records purged."}, []string{"queue", "class"}),
		expires: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dlxbridge_quarantine_expiries_total",
			Help: "Quarantine records this process recorded as expired (past the retention, never replayed or purged)."}, []string{"queue", "class"}),
		agedOut: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dlxbridge_quarantine_aged_out_total",
			Help: "Open quarantine records this process found past quarantine.max_open_age: no longer carried forward, they expire with their segment."}, []string{"queue", "class"}),
	}
	if err := telemetry.Register(reg, m.records, m.oldest, m.intake, m.replays, m.purges, m.expires, m.agedOut); err != nil {
		return nil, err
	}
	return m, nil
}

// freshRecord is a record counted when its keeper stored it.
type freshRecord struct {
	queue, class string
	seen, at     time.Time
}

// freshFor bounds how long a stored record is kept counted while no
// snapshot shows it (a snapshot always will, unless the record was
// removed meanwhile).
const freshFor = 10 * time.Minute

// stored counts a record a keeper has just stored, open, so that the
// first dead letter of an incident shows at the next scrape rather than
// at the next refresh.
func (m *Metrics) stored(r *Record, now time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.fresh[r.ID]; ok {
		return // written twice (a keeper restarted before its ack)
	}
	if m.fresh == nil {
		m.fresh = map[string]freshRecord{}
	}
	f := freshRecord{queue: r.Queue, class: classLabel(string(r.Envelope.Class)), seen: r.Seen(), at: now}
	m.fresh[r.ID] = f
	m.count(f)
}

func (m *Metrics) count(f freshRecord) {
	m.records.WithLabelValues(f.queue, f.class, string(StateOpen)).Inc()
	m.oldest.open(f.queue, f.seen)
}

// Observe sets the gauges from a snapshot.
func (m *Metrics) Observe(s *Snapshot) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.records.Reset()
	seen := map[string]time.Time{} // every queue with records; zero: none open
	for _, g := range s.Gone {
		m.records.WithLabelValues(g.Queue, classLabel(g.Class), string(StateExpired)).Inc()
	}
	for _, r := range s.Records {
		m.records.WithLabelValues(r.Queue, classLabel(string(r.Envelope.Class)), string(r.State)).Inc()
		t, ok := seen[r.Queue]
		if r.State == StateOpen && (t.IsZero() || r.Seen().Before(t)) {
			t = r.Seen()
		}
		if !ok || !t.IsZero() {
			seen[r.Queue] = t
		}
	}
	m.oldest.set(seen)
	if len(m.fresh) > 0 {
		in := make(map[string]bool, len(s.Records))
		for _, r := range s.Records {
			in[r.ID] = true
		}
		for id, f := range m.fresh {
			switch {
			case in[id], s.At.Sub(f.at) > freshFor:
				delete(m.fresh, id)
			default: // stored after the snapshot read its stream
				m.count(f)
			}
		}
	}
	for intake, n := range s.Intake {
		m.intake.WithLabelValues(intake).Set(float64(n))
	}
}

// classLabel is the class label of a record's class: a class triage gives
// (triage.Classes), or "" (none, an unverified envelope without x-death);
// any other class, which only a claimed envelope (a keeper without the key
// keeps the claim) can carry, is "other", so that a producer cannot mint a
// series per message.
func classLabel(class string) string {
	if class == "" || knownClasses[triage.Class(class)] {
		return class
	}
	return "other"
}

var knownClasses = func() map[triage.Class]bool {
	m := map[triage.Class]bool{}
	for _, c := range triage.Classes() {
		m[c] = true
	}
	return m
}()

func (m *Metrics) replayed(queue, class string) {
	if m != nil {
		m.replays.WithLabelValues(queue, classLabel(class)).Inc()
	}
}

func (m *Metrics) purged(queue, class string) {
	if m != nil {
		m.purges.WithLabelValues(queue, classLabel(class)).Inc()
	}
}

func (m *Metrics) agedOutOne(queue, class string) {
	if m != nil {
		m.agedOut.WithLabelValues(queue, classLabel(class)).Inc()
	}
}

func (m *Metrics) expired(queue, class string) {
	if m != nil {
		m.expires.WithLabelValues(queue, classLabel(class)).Inc()
	}
}

// Refresh takes a snapshot with in and observes it: call it on a timer
// (every scrape would read every record). The oldest open record's age
// keeps growing between refreshes: it is computed at each scrape.
func (m *Metrics) Refresh(ctx context.Context, in *Inspector) error {
	s, err := in.Snapshot(ctx)
	if err != nil {
		return err
	}
	m.Observe(s)
	return nil
}

// oldestOpen exports, at each scrape, the age of each queue's oldest open
// record as of the last snapshot.
type oldestOpen struct {
	desc *prometheus.Desc
	now  func() time.Time

	mu   sync.Mutex
	seen map[string]time.Time // zero: the queue has records, none open
}

func (o *oldestOpen) set(seen map[string]time.Time) {
	o.mu.Lock()
	o.seen = seen
	o.mu.Unlock()
}

// open notes an open record of queue first seen at t.
func (o *oldestOpen) open(queue string, t time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen == nil {
		o.seen = map[string]time.Time{}
	}
	if old, ok := o.seen[queue]; !ok || old.IsZero() || t.Before(old) {
		o.seen[queue] = t
	}
}

// Describe implements prometheus.Collector.
func (o *oldestOpen) Describe(ch chan<- *prometheus.Desc) { ch <- o.desc }

// Collect implements prometheus.Collector.
func (o *oldestOpen) Collect(ch chan<- prometheus.Metric) {
	now := o.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for queue, t := range o.seen {
		age := 0.0
		if !t.IsZero() {
			age = max(now.Sub(t).Seconds(), 0)
		}
		ch <- prometheus.MustNewConstMetric(o.desc, prometheus.GaugeValue, age, queue)
	}
}
