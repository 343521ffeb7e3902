package quarantine

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the quarantine's Prometheus collectors, registered on the
// registerer given to NewMetrics (none if nil). Observe sets the gauges
// from an Inspector snapshot; a Replayer with Metrics counts what it
// replays and purges. A nil *Metrics does nothing.
type Metrics struct {
	records *prometheus.GaugeVec
	oldest  *prometheus.GaugeVec
	intake  *prometheus.GaugeVec
	replays *prometheus.CounterVec
	purges  *prometheus.CounterVec
}

// NewMetrics makes the collectors and registers them on reg (if not nil):
//
//	dlxbridge_quarantine_records{queue,class,state}  records kept, by state (open, replayed, purged, expired): arrivals, and expiries never silent
//	dlxbridge_quarantine_oldest_open_age_seconds{queue}
//	dlxbridge_quarantine_intake_waiting{intake}  messages not yet stored by the runtime's keeper
//	dlxbridge_quarantine_replays_total{queue,class}, dlxbridge_quarantine_purges_total{queue,class}
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		records: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dlxbridge_quarantine_records",
			Help: "Quarantine records by queue, failure class and state (open, replayed, purged, expired)."}, []string{"queue", "class", "state"}),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dlxbridge_quarantine_oldest_open_age_seconds",
			Help: "Age of the oldest open quarantine record."}, []string{"queue"}),
		intake: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dlxbridge_quarantine_intake_waiting",
			Help: "Messages in a quarantine intake not yet stored as records."}, []string{"intake"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dlxbridge_quarantine_replays_total",
			Help: "Quarantine records replayed."}, []string{"queue", "class"}),
		purges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dlxbridge_quarantine_purges_total",
			Help: "Quarantine records purged."}, []string{"queue", "class"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.records, m.oldest, m.intake, m.replays, m.purges} {
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
	m.oldest.Reset()
	queues := map[string]bool{}
	for _, r := range s.Records {
		m.records.WithLabelValues(r.Queue, string(r.Envelope.Class), string(r.State)).Inc()
		queues[r.Queue] = true
	}
	for q := range queues {
		m.oldest.WithLabelValues(q).Set(s.OldestOpenAge(q).Seconds())
	}
	for intake, n := range s.Intake {
		m.intake.WithLabelValues(intake).Set(float64(n))
	}
}

func (m *Metrics) replayed(queue, class string) {
	if m != nil {
		m.replays.WithLabelValues(queue, class).Inc()
	}
}

func (m *Metrics) purged(queue, class string) {
	if m != nil {
		m.purges.WithLabelValues(queue, class).Inc()
	}
}

// Refresh takes a snapshot with in and observes it: call it on a timer
// (every scrape would read every record).
func (m *Metrics) Refresh(ctx context.Context, in *Inspector) error {
	s, err := in.Snapshot(ctx)
	if err != nil {
		return err
	}
	m.Observe(s)
	return nil
}
