package bench

import (
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The bridge's confirm_wait_ms is the mean over every kind of copy, in
// milliseconds, of what the runtime observed; other histograms do not
// count, and without a sample it is 0 (omitted from the report).
func TestConfirmWaitMSIsTheMeanInMilliseconds(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if got := confirmWaitMS(reg); got != 0 {
		t.Fatalf("no samples: %v ms, want 0", got)
	}
	confirm := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "dlxbridge_publish_confirm_seconds"}, []string{"queue", "kind"})
	other := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dlxbridge_handler_duration_seconds"})
	reg.MustRegister(confirm, other)
	if got := confirmWaitMS(reg); got != 0 {
		t.Fatalf("no samples yet: %v ms, want 0", got)
	}
	confirm.WithLabelValues("q", "retry").Observe(0.010)
	confirm.WithLabelValues("q", "quarantine").Observe(0.020)
	confirm.WithLabelValues("q", "quarantine").Observe(0.060)
	other.Observe(5)
	if got := confirmWaitMS(reg); math.Abs(got-30) > 1e-9 {
		t.Fatalf("got %v ms, want 30", got)
	}
}
