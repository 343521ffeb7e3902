package config_test

import (
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/config"
)

// A rate too small to pace by is refused, as a replay's is (one message
// an hour at the slowest): at 1e-300 a second the ramp sends the first
// message and then waits past the end of time for the second, holding the
// quarantine's replay lock, so that no operator can replay or purge until
// the runtime restarts.
func TestAutoRedriveRefusesARateTooSmallToPace(t *testing.T) {
	t.Parallel()
	for _, rate := range []string{"1e-300", "0.0001"} {
		_, err := config.Parse([]byte(queueDoc("quarantine:\n  auto_redrive: {mode: on, rate: " + rate + "}\n")))
		if err == nil || !strings.Contains(err.Error(), "queues[0].quarantine.auto_redrive.rate") {
			t.Errorf("rate %s: %v, want refused", rate, err)
		}
	}
	cfg, err := config.Parse([]byte(queueDoc("quarantine:\n  auto_redrive: {mode: on, rate: 0.00028}\n")))
	if err != nil || cfg.Queues[0].Quarantine.AutoRedrive.Rate != 0.00028 {
		t.Errorf("one message an hour: %v", err)
	}
}
