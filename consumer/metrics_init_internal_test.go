package consumer

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlxbridge/dlxbridge/triage"
)

// A queue's label sets known at start exist at 0 before any message, so a
// dashboard shows 0 rather than "No data" and increase() sees the first
// event.
func TestQueueSeriesExistAtZeroFromTheStart(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.forQueue("orders", 4)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			if c := s.GetCounter(); c != nil && c.GetValue() != 0 {
				t.Errorf("%s starts at %v", f.GetName(), c.GetValue())
			}
			got[f.GetName()]++
		}
	}
	for name, want := range map[string]int{
		"dlxbridge_quarantined_total":        len(triage.Classes()),
		"dlxbridge_retries_total":            4,
		"dlxbridge_deliveries_total":         8,
		"dlxbridge_publish_failures_total":   3,
		"dlxbridge_dead_lettered_total":      2,
		"dlxbridge_handlers_abandoned_total": 1,
		"dlxbridge_immediate_retries_total":  1,
		"dlxbridge_publishing_blocked":       1,
	} {
		if got[name] != want {
			t.Errorf("%s: %d series at start, want %d", name, got[name], want)
		}
	}
}
