package config_test

import (
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/config"
)

// A queue with a length limit cannot retry through the shared tiers: full,
// it refuses the retries its tier dead-letters back, the tier's
// at-least-once dead-lettering holds them and tries again, and past a few
// dozen of them it holds back every other queue's retries in the same tier
// until the full queue drains (seen on 3.10.8 and 4.3.6;
// topology/shared_review_test.go). Its own lanes hold back only its own.
func TestMaxLengthNeedsPerQueueLanes(t *testing.T) {
	t.Parallel()
	_, err := config.Parse([]byte(queueDoc("max_length: 1000\nretry: {tier_queues: shared}\n")))
	if err == nil || !strings.Contains(err.Error(), "queues[0].max_length") || !strings.Contains(err.Error(), "per-queue") {
		t.Errorf("max_length with shared tiers: %v, want refused, naming per-queue lanes", err)
	}
	for _, doc := range []string{"max_length: 1000\nretry: {tier_queues: per-queue}\n", "retry: {tier_queues: shared}\n"} {
		if _, err := config.Parse([]byte(queueDoc(doc))); err != nil {
			t.Errorf("%q: %v", doc, err)
		}
	}
}
