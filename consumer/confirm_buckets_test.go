package consumer

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// DlxbridgeConfirmsSlow (deploy/prometheus/alerts.yml) fires when the p99
// of dlxbridge_publish_confirm_seconds is over 1 s. histogram_quantile
// interpolates inside a bucket, so 1 s must be a bucket bound: inside a
// bucket from 0.76 to 1.9 s, copies that all took 0.8 s would read as a
// p99 of up to 1.9 s and fire it, none of them having waited a second.
func TestConfirmWaitBucketsBoundTheAlertsThreshold(t *testing.T) {
	t.Parallel()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h := m.publishConfirm.WithLabelValues("q", "retry")
	h.Observe(0.8)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.publishConfirm)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var bounds []float64
	for _, b := range mfs[0].GetMetric()[0].GetHistogram().GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	if !slices.Contains(bounds, 1) {
		t.Errorf("buckets %v: 1 s, the alert's threshold, is not a bound", bounds)
	}
	if bounds[0] > 0.001 || bounds[len(bounds)-1] < 5 {
		t.Errorf("buckets %v: want from at most 1 ms to at least 5 s", bounds)
	}
}
