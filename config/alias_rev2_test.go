package config_test

import (
	"testing"

	"github.com/dlxbridge/dlxbridge/config"
)

// A bare 0 anchored once and aliased both as a duration and as a number is
// the same 0 to each: making it a duration must not make it a string where
// it is a number.
func TestBareZeroAliasedAsNumberAndDuration(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		"retry: {jitter: &z 0, max_elapsed: *z, tiers: [1s]}",
		"retry: {max_elapsed: &z 0, jitter: *z, tiers: [1s]}",
	} {
		cfg, err := config.Parse([]byte(queueDoc(doc)))
		if err != nil {
			t.Errorf("%s: %v", doc, err)
			continue
		}
		if got := cfg.Queues[0].Retry.MaxElapsedValue(); got != 0 {
			t.Errorf("%s: max_elapsed %s, want 0", doc, got)
		}
		if j := cfg.Queues[0].Retry.Jitter; j == nil || *j != 0 {
			t.Errorf("%s: jitter %v, want 0", doc, j)
		}
	}
}
