package quarantine

import (
	"testing"
	"time"
)

// Events read from several quarantines' streams come out in time order,
// each stream's own order kept even where its clock went back.
func TestMergeEventsKeepsTimeAndEachStreamsOrder(t *testing.T) {
	t.Parallel()
	at := func(s int) time.Time { return time.Unix(int64(s), 0) }
	a := []Event{{Run: "a1", At: at(1)}, {Run: "a2", At: at(5)}, {Run: "a3", At: at(4)}}
	b := []Event{{Run: "b1", At: at(2)}, {Run: "b2", At: at(6)}}
	got := ""
	for _, e := range mergeEvents([][]Event{a, b, nil}) {
		got += e.Run + " "
	}
	if want := "a1 b1 a2 a3 b2 "; got != want {
		t.Fatalf("merged %q, want %q", got, want)
	}
}
