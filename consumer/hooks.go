package consumer

import (
	"time"

	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// testHooks are signals compiled into the runtime so tests wait on events
// instead of sleeping. They are set only by this package's tests, which
// learn outcomes through Config.OnSettled, as users do.
type testHooks struct {
	consuming    func()
	reconnecting func(err error)
	// frameMax, if set, replaces the publishing connection's frame_max in
	// frame.Fit.
	frameMax int
	stopping func(queue string) // a queue session's stop began (its consumer is being cancelled)
	blocked  func(active bool)  // the broker blocked or unblocked the publishing connection
	// keeper runs the quarantine keepers under test hooks. Without it the
	// intake keeps what arrives, for the tests that read it directly.
	keeper bool
	// breaker is told every breaker transition, by queue.
	breaker func(queue string, t triage.Transition)
	// maxHold, if set, replaces maxHold.
	maxHold time.Duration
	// abandonedReturned: the handler of an abandoned call returned, and
	// its goroutine let go of it (slot freed, result discarded).
	abandonedReturned func()
	// redrive is told each automatic redrive's end, by queue.
	redrive func(queue string, res *quarantine.ReplayResult, err error)
	// adopted is told how each reading of the outage windows at a
	// session's start ended.
	adopted func(err error)
	// redriveAfterFailedAdopt, if set, replaces how long the runtime
	// waits to read the windows again after a failed read.
	redriveAfterFailedAdopt time.Duration
}
