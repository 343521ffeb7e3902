package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/internal/cli"
)

// The demo runs to the end on the real broker, its final table matches
// what it published, and it deletes what it declared.
func TestDemoEndsWhereItPublished(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	b := &topoBundle{env: env}
	start := time.Now()
	out, errOut := b.mustRunAll(t, cli.ExitOK, "demo", "--prefix", env.Prefix)
	took := time.Since(start)
	final := out[strings.LastIndex(out, "final, after"):]
	want := map[string]string{
		"demo-valid-1": "handled", "demo-valid-6": "handled",
		"demo-flaky-1": "handled", "demo-flaky-2": "handled",
		"demo-permanent-1": "quarantined (permanent)", "demo-crash-1": "quarantined (panic)",
		"demo-invalid-1": "quarantined (schema)", "demo-invalid-2": "quarantined (schema)",
	}
	attempts := map[string]string{"demo-valid-1": "1", "demo-flaky-1": "2", "demo-flaky-2": "3",
		"demo-permanent-1": "1", "demo-crash-1": "3", "demo-invalid-1": "0"}
	rows := 0
	for _, line := range strings.Split(final, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "demo-") {
			continue
		}
		rows++
		where := strings.Join(f[3:], " ")
		if w, ok := want[f[0]]; ok && where != w {
			t.Errorf("%s ended %q, want %q", f[0], where, w)
		}
		if a, ok := attempts[f[0]]; ok && f[2] != a {
			t.Errorf("%s took %s attempts, want %s", f[0], f[2], a)
		}
	}
	if rows != 12 {
		t.Errorf("final table has %d rows, want the 12 published:\n%s", rows, final)
	}
	for _, s := range []string{
		"published 12: handled 8, quarantined 4 (panic 1, permanent 1, schema 2); the runtime counted 8 acked, 5 retried, 4 quarantined",
		"waiting in retry tier 0 (1s)", "waiting in retry tier 1 (2s)", "deleted the demo's queues and exchanges",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s\n%s", s, out, errOut)
		}
	}
	if took > time.Minute {
		t.Errorf("the demo took %s, want under a minute", took)
	}
	t.Logf("demo took %s:\n%s", took.Round(time.Millisecond), out)
}
