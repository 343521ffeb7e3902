package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
)

// Automatic redrive is off unless asked for, shows its defaults, and each
// key is checked (with the mode off too) and named by its path.
func TestAutoRedriveKeys(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(queueDoc("")))
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Queues[0].Quarantine.AutoRedrive
	if a.On() || a.Mode != config.RedriveOff || a.Rate != 20 || a.StopRatio != 0.2 || a.DelayValue() != 5*time.Second {
		t.Errorf("defaults: %+v (delay %v)", a, a.DelayValue())
	}
	cfg, err = config.Parse([]byte(queueDoc("quarantine:\n  auto_redrive: {mode: dry-run, rate: 5, stop_ratio: 0.5, delay: 0s}\n")))
	if err != nil {
		t.Fatal(err)
	}
	a = cfg.Queues[0].Quarantine.AutoRedrive
	if !a.On() || a.Mode != config.RedriveDryRun || a.Rate != 5 || a.StopRatio != 0.5 || a.DelayValue() != 0 {
		t.Errorf("set: %+v", a)
	}
	// YAML 1.1 reads a bare on or off as a boolean: here they are the modes.
	for _, mode := range []string{"on", "off"} {
		cfg, err := config.Parse([]byte(queueDoc("quarantine:\n  auto_redrive: {mode: " + mode + "}\n")))
		if err != nil || cfg.Queues[0].Quarantine.AutoRedrive.Mode != mode {
			t.Errorf("mode %s: %v %+v", mode, err, cfg)
		}
	}
	for _, tt := range []struct{ doc, want string }{
		{"{mode: yes}", `queues[0].quarantine.auto_redrive.mode: must be off, dry-run or on, not "yes"`},
		{"{mode: off, rate: -1}", "queues[0].quarantine.auto_redrive.rate"},
		{"{rate: 20000}", "queues[0].quarantine.auto_redrive.rate"},
		{"{stop_ratio: 1.5}", "queues[0].quarantine.auto_redrive.stop_ratio"},
		{"{delay: -1s}", "queues[0].quarantine.auto_redrive.delay: must be >= 0"},
		{"{mode: on}\nbreaker: {enabled: false}", "queues[0].quarantine.auto_redrive.mode: on needs the queue's circuit breaker"},
	} {
		_, err := config.Parse([]byte(queueDoc("quarantine:\n  auto_redrive: " + tt.doc + "\n")))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.doc, err, tt.want)
		}
	}
}
