package consumer

import (
	"testing"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A re-admitted copy starts the work queue's own count: neither delivery
// count (4.3 adds x-acquired-count) may travel on it stale, or a
// producer's forged one with it.
func TestBuildReadmitDropsEveryDeliveryCount(t *testing.T) {
	t.Parallel()
	b := newSettleBundle(t, frame.DefaultFrameSize)
	d := delivery()
	d.Headers[wire.HeaderAcquiredCount] = int64(3)
	f := failure{verdict: triage.Verdict{Action: triage.ActionReadmit, Class: triage.ClassCrashLoop, Reason: "re-admitted"}}
	got, err := build(b.input(d, f))
	if err != nil {
		t.Fatal(err)
	}
	for k := range got.p.Headers {
		if wire.IsCountHeader(k) {
			t.Errorf("%s kept on the re-admission: %v", k, got.p.Headers[k])
		}
	}
}
