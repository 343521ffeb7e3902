package config

import (
	"math"
	"time"
)

// Automatic redrive modes (AutoRedrive.Mode).
const (
	// RedriveOff: nothing is replayed without an operator.
	RedriveOff = "off"
	// RedriveDryRun: when the breaker closes after an outage, the runtime
	// logs what it would replay and sends nothing.
	RedriveDryRun = "dry-run"
	// RedriveOn: it replays them.
	RedriveOn = "on"
)

// Defaults of AutoRedrive.
const (
	defaultRedriveRate      = 20.0
	defaultRedriveStopRatio = 0.2
	defaultRedriveDelay     = 5 * time.Second
	// minRedriveRate is the slowest rate: one message an hour, as for
	// any replay (quarantine.MinRate).
	minRedriveRate = 1.0 / 3600
	maxRedriveRate = 10000
)

// AutoRedrive is a queue's automatic redrive (docs/quarantine.md,
// "Automatic redrive"): when its circuit breaker closes after an outage,
// the runtime replays the queue's open records of class transient or
// timeout whose failure fell inside the outage, through the rules of every
// replay, ramped up to Rate, and stops, leaving the rest open, when
// failures return.
type AutoRedrive struct {
	// Mode is "off", "dry-run" (log what would be replayed) or "on".
	// Needs the signing key (security.signing_key_env): without it the
	// runtime warns and replays nothing. Defaults to "off".
	Mode string `yaml:"mode"`
	// Rate is the highest pace, messages per second, that the ramp (1, 2,
	// 5, 10, 20, 50, ... per second, a second each) climbs to. From one
	// message an hour to 10000 a second. Defaults to 20.
	Rate float64 `yaml:"rate"`
	// StopRatio stops the redrive when the replayed messages that failed
	// again are at least this share of those settled (counted from the
	// fifth on; one failure among the first five is a share of 1/5). In
	// (0, 1]. Defaults to 0.2.
	StopRatio float64 `yaml:"stop_ratio"`
	// Delay is how long the breaker must stay closed before the redrive
	// starts. >= 0. Defaults to 5s.
	Delay *time.Duration `yaml:"delay"`
}

// On reports whether the runtime acts on the queue's outages (on or dry-run).
func (a AutoRedrive) On() bool { return a.Mode == RedriveOn || a.Mode == RedriveDryRun }

// DelayValue is Delay with its default.
func (a AutoRedrive) DelayValue() time.Duration {
	if a.Delay == nil {
		return defaultRedriveDelay
	}
	return *a.Delay
}

func (a *AutoRedrive) applyDefaults() {
	if a.Mode == "" {
		a.Mode = RedriveOff
	}
	if a.Rate == 0 {
		a.Rate = defaultRedriveRate
	}
	if a.StopRatio == 0 {
		a.StopRatio = defaultRedriveStopRatio
	}
	if a.Delay == nil {
		d := defaultRedriveDelay
		a.Delay = &d
	}
}

// validate checks every key (even with mode off, so that a typo does not
// wait for the day it is turned on) and reports each problem at its path
// under path. breakerOn: the queue's breaker is enabled, which on and
// dry-run need (its transitions are the outages).
func (a AutoRedrive) validate(path string, breakerOn bool) []FieldError {
	var errs []FieldError
	switch a.Mode {
	case "", RedriveOff:
	case RedriveDryRun, RedriveOn:
		if !breakerOn {
			errs = append(errs, FieldError{Path: path + ".mode", Msg: a.Mode + " needs the queue's circuit breaker (breaker.enabled: true): its outages are what is redriven"})
		}
	default:
		errs = append(errs, FieldError{Path: path + ".mode", Msg: "must be off, dry-run or on, not " + quoteValue(a.Mode)})
	}
	if math.IsNaN(a.Rate) || a.Rate < minRedriveRate || a.Rate > maxRedriveRate {
		errs = append(errs, FieldError{Path: path + ".rate", Msg: "must be a rate between one message an hour (0.00028) and 10000 messages per second"})
	}
	if math.IsNaN(a.StopRatio) || a.StopRatio < 0 || a.StopRatio > 1 {
		errs = append(errs, FieldError{Path: path + ".stop_ratio", Msg: "must be in (0, 1]"})
	}
	if a.Delay != nil && *a.Delay < 0 {
		errs = append(errs, FieldError{Path: path + ".delay", Msg: "must be >= 0"})
	}
	return errs
}

func quoteValue(s string) string { return `"` + s + `"` }
