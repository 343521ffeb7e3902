package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/triage"
)

// An unset breaker is on, trips on dependency signals only, and shows the
// policy's defaults.
func TestBreakerDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(queueDoc("")))
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Queues[0].Breaker
	if !b.EnabledValue() || b.ConsecutiveFailures != 0 || b.FailureRatio != 0 {
		t.Errorf("breaker %+v: want on, counting triggers off", b)
	}
	want := triage.BreakerPolicy{}.WithDefaults()
	if got := b.Policy().WithDefaults(); got != want {
		t.Errorf("policy %+v, want the triage defaults %+v", got, want)
	}
	if b.Window != 30*time.Second || b.WindowSize != 100 || b.MinVolume != 20 ||
		b.MinOpen != 5*time.Second || b.MaxOpen != 5*time.Minute || b.Probes != 1 {
		t.Errorf("defaults not shown in the loaded config (docs/config.md lists them): %+v", b)
	}
}

func TestBreakerKeys(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(queueDoc(`breaker:
  enabled: false
  consecutive_failures: 5
  failure_ratio: 0.5
  window: 1m
  window_size: 50
  min_volume: 10
  min_open: 2s
  max_open: 1m
  probes: 3
`)))
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Queues[0].Breaker
	want := triage.BreakerPolicy{ConsecutiveFailures: 5, FailureRatio: 0.5, Window: time.Minute, WindowSize: 50,
		MinVolume: 10, MinOpen: 2 * time.Second, MaxOpen: time.Minute, Probes: 3}
	if b.EnabledValue() || b.Policy() != want {
		t.Errorf("breaker %+v, want off with %+v", b, want)
	}
}

// Problems are reported at the key's path and in the file's words, by
// triage's rules (checked even with the breaker off).
func TestBreakerInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct{ yaml, want string }{
		{"{consecutive_failures: -1}", "queues[0].breaker.consecutive_failures: -1 must be >= 0"},
		{"{failure_ratio: 2}", "queues[0].breaker.failure_ratio: 2 must be in [0, 1]"},
		{"{window: -1s}", "queues[0].breaker.window: -1s must be >= 0"},
		{"{window_size: 20000}", "queues[0].breaker.window_size:"},
		{"{failure_ratio: 0.5, window_size: 10}", "queues[0].breaker.min_volume: 20 must be <= window_size (10)"},
		{"{min_open: 10m}", "queues[0].breaker.min_open: 10m0s must be <= max_open (5m0s)"},
		{"{max_open: -1s}", "queues[0].breaker.max_open:"},
		{"{probes: -2}", "queues[0].breaker.probes:"},
		{"{enabled: false, probes: 5000}", "queues[0].breaker.probes:"},
		{"{probs: 2}", `queues[0].breaker.probs: unknown key (did you mean "probes"?)`},
	}
	for _, tt := range tests {
		_, err := config.Parse([]byte(queueDoc("breaker: " + tt.yaml)))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("breaker: %s: got %v, want %q", tt.yaml, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "BreakerPolicy") {
			t.Errorf("breaker: %s: the message speaks Go, not config keys: %v", tt.yaml, err)
		}
	}
}

// Every breaker key is documented in docs/config.md and shown in the
// commented config.yaml.
func TestBreakerKeysDocumented(t *testing.T) {
	t.Parallel()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..")
	docs, err := os.ReadFile(filepath.Join(root, "docs", "config.md"))
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile(filepath.Join(root, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeOf(config.Breaker{})
	for i := 0; i < typ.NumField(); i++ {
		key, _, _ := strings.Cut(typ.Field(i).Tag.Get("yaml"), ",")
		if !strings.Contains(string(docs), "| `"+key+"` |") {
			t.Errorf("docs/config.md has no row for breaker key %s", key)
		}
		if !strings.Contains(string(example), "      "+key+":") {
			t.Errorf("config.yaml does not show breaker key %s", key)
		}
	}
}
