package consumer

import (
	"errors"
	"testing"
	"time"
)

// A job recorder that cannot write (its events stream deleted, say) must
// not log a warning and open a channel five times a second for as long as
// it fails: it warns at the first failure of a run, waits twice as long
// after each up to flushMaxWait, and says once when writing works again.
func TestJobRecorderBacksOffWhileWritesFail(t *testing.T) {
	t.Parallel()
	var f flushRetry
	boom := errors.New("no route")
	wait, warn, back := f.next(nil)
	if wait != flushEvery || warn || back {
		t.Fatalf("after a write: %v %v %v", wait, warn, back)
	}
	warns := 0
	var last time.Duration
	for i := range 20 {
		wait, warn, back = f.next(boom)
		if warn {
			warns++
		}
		if back || wait < last || wait > flushMaxWait || (i > 0 && last < flushMaxWait && wait != min(2*last, flushMaxWait)) {
			t.Fatalf("failure %d: wait %v after %v, back %v", i, wait, last, back)
		}
		last = wait
	}
	if warns != 1 || last != flushMaxWait {
		t.Errorf("20 failures: %d warnings, last wait %v; want 1 and %v", warns, last, flushMaxWait)
	}
	if wait, warn, back = f.next(nil); wait != flushEvery || warn || !back {
		t.Errorf("the write after them: %v %v %v; want flushEvery, recovered", wait, warn, back)
	}
}
