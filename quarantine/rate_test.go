package quarantine

import (
	"context"
	"math"
	"strings"
	"testing"
)

// A rate whose interval cannot be a time.Duration would wrap negative and
// send unpaced: the opposite of what the operator asked. Refused before
// anything is read or claimed (the Replayer here has no connection).
func TestReplayRefusesARateItCannotPace(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{1e-300, MinRate / 2, -1, math.NaN(), math.Inf(1)} {
		_, err := (&Replayer{}).Replay(context.Background(), ReplayOptions{Filter: Filter{Queue: "q"}, Rate: rate})
		if err == nil || !strings.Contains(err.Error(), "replay rate") {
			t.Errorf("rate %g: err = %v, want a refusal of the rate", rate, err)
		}
	}
	if p := newPacer(MinRate); p.interval <= 0 {
		t.Errorf("MinRate paces at %v", p.interval)
	}
}
