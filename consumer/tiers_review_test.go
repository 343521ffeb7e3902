package consumer

import (
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// A queue moved to the shared tiers whose runtime starts before
// `topology apply` has run for its config, on a virtual host where another
// config's apply already declared the shared tiers: the delay exchange and
// the tier are there, the queue's binding on the return exchange is not.
// Its retries must still come back to it, not wait their delay and then be
// parked in the catch-all as if the queue had been deleted (every transient
// failure quarantined, the handler never retried).
func TestARetryComesBackWhenOnlyTheQueuesReturnBindingIsMissing(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	w := newSharedWorld(t, env, nil, "other", "moved")
	moved := w.queue("moved")
	ch := env.Channel("unbind")
	// What the broker looks like when only the other config was applied.
	if err := ch.QueueUnbind(moved.Name, moved.Name, w.topo.Work[1].ReturnExchange, nil); err != nil {
		t.Fatal(err)
	}
	calls := make(chan arrival, 16)
	w.run([]string{"moved"}, failOnce(calls, moved.Name))
	w.publish("moved", "m-1", nil)
	first := waitArrival(t, calls, 15*time.Second)
	if first.attempt != 1 {
		t.Fatalf("first call %+v", first)
	}
	select {
	case back := <-calls:
		if back.id != "m-1" || back.attempt != 2 {
			t.Fatalf("second call %+v, want m-1's retry", back)
		}
	case <-time.After(15 * time.Second):
		u := w.all.SharedTiers.Unrouted()
		t.Fatalf("the retry did not come back (the catch-all %s holds %d, its records stream is the only place it is): %s", u, depth(t, ch, u), fmt.Sprint(w.topo.Work[1].ReturnExchange))
	}
}

// A runtime user without write permission on its queue (as docs/topology.md
// recommends) is refused the binding: the refusal closes only the channel it
// was tried on, and the runtime retries through the shared tiers as before.
func TestARuntimeRefusedTheReturnBindingStillRetries(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	w := newSharedWorld(t, env, nil, "a")
	a := w.queue("a")
	restricted := env.User(brokertest.Permissions{Configure: "^$", Write: "^(?!" + regexp.QuoteMeta(a.Name) + "$).*", Read: ".*"})
	calls := make(chan arrival, 16)
	own := env.URL
	env.URL = restricted
	w.run([]string{"a"}, failOnce(calls, a.Name))
	env.URL = own
	w.publish("a", "m-1", nil)
	for attempt := 1; attempt <= 2; attempt++ {
		if c := waitArrival(t, calls, 15*time.Second); c.id != "m-1" || c.attempt != attempt {
			t.Fatalf("call %+v, want m-1's attempt %d", c, attempt)
		}
	}
}
