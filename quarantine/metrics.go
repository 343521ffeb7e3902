package quarantine

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlxbridge/dlxbridge/triage"
)

// Metrics are the quarantine's Prometheus collectors, registered on the
// registerer given to NewMetrics (none if nil). Observe sets the gauges
// from an Inspector snapshot; a Replayer with Metrics counts what it
// replays and purges. A nil *Metrics does nothing.
type Metrics struct {
	records *prometheus.GaugeVec
	oldest  *oldestOpen
	intake  *prometheus.GaugeVec
	replays *prometheus.CounterVec
	purges  *prometheus.CounterVec
	expires *prometheus.CounterVec
}

// NewMetrics makes the collectors and registers them on reg (if not nil):
//
//	dlxbridge_quarantine_records{queue,class,state}  records kept, by state (open, replayed, purged, expired): arrivals, and expiries never silent
//	dlxbridge_quarantine_oldest_open_age_seconds{queue}  computed at each scrape from the last snapshot, so it grows between refreshes
//	dlxbridge_quarantine_intake_waiting{intake}  messages not yet stored by the runtime's keeper
//	dlxbridge_quarantine_replays_total{queue,class}, dlxbridge_quarantine_purges_total{queue,class}
//	dlxbridge_quarantine_expiries_total{queue,class}  records this process first named in an expired event (Replayer.RecordExpiries)
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
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.records, m.oldest, m.intake, m.replays, m.purges, m.expires} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// Observe sets the gauges from a snapshot.
func (m *Metrics) Observe(s *Snapshot) {
	if m == nil {
		return
	}
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
