package quarantine

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

// Durations in the JSON that stats and replay print carry their unit in
// the name and are seconds: a bare time.Duration would be nanoseconds
// that nothing on the page says are nanoseconds.
func TestDurationsInJSONAreSeconds(t *testing.T) {
	t.Parallel()
	g := Group{Queue: "orders", Open: 2, OldestOpenAge: Seconds(90 * time.Second)}
	b, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"oldest_open_age_seconds":90`) || strings.Contains(string(b), `"OldestOpenAge"`) {
		t.Fatalf("group JSON: %s", b)
	}
	var back Group
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.OldestOpenAge != g.OldestOpenAge || back.Queue != "orders" || back.Open != 2 {
		t.Fatalf("round trip: %+v", back)
	}

	r := ReplayResult{Run: "r1", Sent: []string{"a"}, Duration: Seconds(1500 * time.Millisecond)}
	b, err = json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"duration_seconds":1.5`) || strings.Contains(string(b), `"Duration"`) {
		t.Fatalf("replay JSON: %s", b)
	}
	var rback ReplayResult
	if err := json.Unmarshal(b, &rback); err != nil {
		t.Fatal(err)
	}
	if rback.Duration != r.Duration || rback.Run != "r1" || len(rback.Sent) != 1 {
		t.Fatalf("round trip: %+v", rback)
	}
}

func TestSecondsDurationSaturates(t *testing.T) {
	t.Parallel()
	for in, want := range map[float64]time.Duration{
		math.NaN(): 0, math.Inf(1): math.MaxInt64, math.Inf(-1): math.MinInt64,
		1e300: math.MaxInt64, -1e300: math.MinInt64, 2.5: 2500 * time.Millisecond,
	} {
		if got := secondsDuration(in); got != want {
			t.Errorf("secondsDuration(%v) = %v, want %v", in, got, want)
		}
	}
}
