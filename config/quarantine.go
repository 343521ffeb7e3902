package config

import (
	"strconv"
	"time"
)

// defaultMaxRedrives is how many times a message may be replayed out of the
// quarantine when a queue names no max_redrives.
const defaultMaxRedrives = 3

// Suffixes of the streams beside each quarantine queue (see
// docs/quarantine.md): the records, read without consuming, and the events
// (replayed, purged: the audit trail).
const (
	recordsSuffix = ".records"
	EventsSuffix  = ".events"
)

// RecordsStream names the stream that keeps this quarantine's records.
func (q Quarantine) RecordsStream() string { return q.Queue + recordsSuffix }

// EventsStream names the stream of what happened to those records.
func (q Quarantine) EventsStream() string { return q.Queue + EventsSuffix }

// MaxRedrivesValue returns the effective redrive budget.
func (q Quarantine) MaxRedrivesValue() int {
	if q.MaxRedrives == nil {
		return defaultMaxRedrives
	}
	return *q.MaxRedrives
}

// MaxAge is Retention as a stream's x-max-age: whole seconds, rounded up,
// at least one.
func (q Quarantine) MaxAge() string { return formatSeconds(q.retentionSeconds()) }

// EventsMaxAge keeps events twice as long as records: an event that expired
// before its record would make a resolved record look open again. It
// doubles whole seconds, not the Duration: twice the longest retention a
// Duration holds is still a few billion seconds, while twice the Duration
// would wrap and give the audit trail a max-age of one second.
func (q Quarantine) EventsMaxAge() string { return formatSeconds(2 * q.retentionSeconds()) }

// retentionSeconds is Retention in whole seconds, rounded up without adding
// to the Duration (which would wrap at its maximum), at least one.
func (q Quarantine) retentionSeconds() int64 {
	s := int64(q.Retention / time.Second)
	if q.Retention%time.Second > 0 {
		s++
	}
	return max(s, 1)
}

func formatSeconds(s int64) string { return strconv.FormatInt(s, 10) + "s" }
