package config

import (
	"errors"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/dlxbridge/dlxbridge/triage"
)

// Breaker is a queue's circuit breaker: while the dependency its handlers
// call is down, it pauses consumption so that messages wait in the work
// queue untouched instead of spending their retries (docs/breaker.md). Its
// rules are triage.BreakerPolicy's; config only names the keys.
type Breaker struct {
	// Enabled turns the breaker on. With the other keys at their defaults
	// it opens only on an explicit dependency signal: a handler returning
	// triage.DependencyDown, or the sidecar's endpoint answering HTTP 429
	// or 503 or refusing the connection. Defaults to true.
	Enabled *bool `yaml:"enabled"`
	// ConsecutiveFailures opens the breaker after this many transient or
	// timeout failures in a row. 0 disables the trigger. Must be >= 0.
	// Defaults to 0 (off; docs/breaker.md says why).
	ConsecutiveFailures int `yaml:"consecutive_failures"`
	// FailureRatio opens the breaker when transient or timeout failures
	// make up at least this share of the outcomes in the window, once it
	// holds MinVolume of them. 0 disables the trigger. Must be in [0, 1].
	// Defaults to 0 (off).
	FailureRatio float64 `yaml:"failure_ratio"`
	// Window is how far back the ratio looks. Defaults to 30s.
	Window time.Duration `yaml:"window"`
	// WindowSize is how many of the latest outcomes the ratio looks at. In
	// [1, 10000]. Defaults to 100.
	WindowSize int `yaml:"window_size"`
	// MinVolume is how many outcomes the window must hold before the ratio
	// can trip; at most WindowSize. Defaults to 20.
	MinVolume int `yaml:"min_volume"`
	// MinOpen is the first open period when the dependency gave no
	// Retry-After; each reopen without closing doubles it (plus up to 20%
	// jitter), up to MaxOpen. Defaults to 5s.
	MinOpen time.Duration `yaml:"min_open"`
	// MaxOpen bounds every open period, a signalled Retry-After included.
	// Defaults to 5m.
	MaxOpen time.Duration `yaml:"max_open"`
	// Probes is how many messages a half-open breaker lets through at once,
	// and how many must succeed to close it. In [1, 1000]. Defaults to 1.
	Probes int `yaml:"probes"`
}

// EnabledValue returns whether the breaker is on (defaults applied).
func (b Breaker) EnabledValue() bool { return b.Enabled == nil || *b.Enabled }

// Policy is the breaker's triage policy.
func (b Breaker) Policy() triage.BreakerPolicy {
	return triage.BreakerPolicy{
		ConsecutiveFailures: b.ConsecutiveFailures,
		FailureRatio:        b.FailureRatio,
		Window:              b.Window,
		WindowSize:          b.WindowSize,
		MinVolume:           b.MinVolume,
		MinOpen:             b.MinOpen,
		MaxOpen:             b.MaxOpen,
		Probes:              b.Probes,
	}
}

// applyDefaults fills unset keys with the policy's defaults, so that a
// loaded config shows the values in effect.
func (b *Breaker) applyDefaults() {
	if b.Enabled == nil {
		on := true
		b.Enabled = &on
	}
	d := b.Policy().WithDefaults()
	b.Window, b.WindowSize, b.MinVolume = d.Window, d.WindowSize, d.MinVolume
	b.MinOpen, b.MaxOpen, b.Probes = d.MinOpen, d.MaxOpen, d.Probes
}

// breakerKeys renames BreakerPolicy's Go field names to config keys, longest
// first so that WindowSize is not read as Window + "Size".
var breakerKeys = func() *strings.Replacer {
	t := reflect.TypeOf(Breaker{})
	var names []string
	keys := map[string]string{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		names = append(names, f.Name)
		keys[f.Name] = key
	}
	sort.Slice(names, func(i, j int) bool { return len(names[i]) > len(names[j]) })
	var pairs []string
	for _, n := range names {
		pairs = append(pairs, n, keys[n])
	}
	return strings.NewReplacer(pairs...)
}()

// validate checks the breaker with triage's rules (even when it is off, so
// a typo does not wait for the day it is turned on) and reports the
// problem at the key's path under path.
func (b Breaker) validate(path string) (FieldError, bool) {
	err := b.Policy().Validate()
	if err == nil {
		return FieldError{}, false
	}
	var pe *triage.BreakerPolicyError
	if !errors.As(err, &pe) {
		return FieldError{Path: path, Msg: err.Error()}, true
	}
	return FieldError{Path: path + "." + breakerKeys.Replace(pe.Field), Msg: breakerKeys.Replace(pe.Msg)}, true
}
