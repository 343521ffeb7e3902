package quarantine

import (
	"encoding/json"
	"math"
	"time"
)

// Seconds is a duration that JSON writes as a number of seconds (a bare
// time.Duration would be nanoseconds with no unit in its name); the field
// names say so (duration_seconds, oldest_open_age_seconds).
type Seconds time.Duration

// MarshalJSON writes s as a number of seconds.
func (s Seconds) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(s).Seconds())
}

// UnmarshalJSON reads a number of seconds.
func (s *Seconds) UnmarshalJSON(b []byte) error {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*s = Seconds(secondsDuration(f))
	return nil
}

// secondsDuration turns seconds back into a Duration, saturating instead
// of overflowing.
func secondsDuration(s float64) time.Duration {
	const two63 = float64(1 << 63)
	ns := s * float64(time.Second)
	switch {
	case ns != ns: // NaN
		return 0
	case ns >= two63:
		return math.MaxInt64
	case ns <= -two63:
		return math.MinInt64
	}
	return time.Duration(ns)
}
