package topology

import (
	"math"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
)

// A stream declared with the max-age a wrapped retention gave (one second)
// is drift to verify: it computes the events' max-age the way apply does, so
// the two can only agree when both are right.
func TestVerifyReportsAWrappedEventsMaxAge(t *testing.T) {
	t.Parallel()
	jitter := 0.0
	cfg := &config.Config{Queues: []config.Queue{{
		Name:       "t-sat.work",
		Exchange:   config.Exchange{Name: "t-sat.x"},
		Gate:       config.GateOff,
		Retry:      config.Retry{Jitter: &jitter},
		Quarantine: config.Quarantine{Retention: 2562047 * time.Hour},
	}}}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	top, err := Build(cfg, BrokerVersion{Major: 3, Minor: 10})
	if err != nil {
		t.Fatal(err)
	}
	var events *QueueSpec
	for i := range top.Queues {
		if top.Queues[i].Name == cfg.Queues[0].Quarantine.EventsStream() {
			events = &top.Queues[i]
		}
	}
	if events == nil {
		t.Fatal("no events stream in the topology")
	}
	have := &MgmtQueue{Name: events.Name, Type: QueueTypeStream, Durable: true,
		Arguments: map[string]any{ArgQueueType: QueueTypeStream, ArgMaxAge: "1s"}}
	ps, _ := queueProblems(*events, have)
	if len(ps) != 1 || ps[0].Arg != ArgMaxAge {
		t.Fatalf("problems for an events stream of max-age 1s = %v, want one on %s", ps, ArgMaxAge)
	}
}

// A lane's bounds stay ordered and positive at the largest delay and
// jitter, instead of wrapping when rounded up to a millisecond.
func TestLaneBoundsAtTheTop(t *testing.T) {
	t.Parallel()
	top := time.Duration(math.MaxInt64)
	for lane := 0; lane < 4; lane++ {
		lo, hi := laneTTLBounds(top-time.Nanosecond, 1, 4, lane)
		if lo <= 0 || hi < lo {
			t.Errorf("lane %d: [%d, %d]", lane, lo, hi)
		}
	}
	if lo, hi := laneTTLBounds(1500*time.Microsecond, 0, 1, 0); lo != time.Millisecond || hi != 2*time.Millisecond {
		t.Errorf("1.5ms: [%s, %s], want [1ms, 2ms]", lo, hi)
	}
}
