package config_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
)

// Every value derived from a config duration, at the largest duration the
// file can hold: it saturates or is refused, and never wraps into a small
// one.
func TestDerivedValuesAtTheirMaximum(t *testing.T) {
	t.Parallel()
	top := time.Duration(math.MaxInt64)
	q := config.Quarantine{Retention: top}
	// 9223372036.854775807 s, rounded up; twice that for the events.
	if got := q.MaxAge(); got != "9223372037s" {
		t.Errorf("MaxAge at the top = %s, want 9223372037s", got)
	}
	if got := q.EventsMaxAge(); got != "18446744074s" {
		t.Errorf("EventsMaxAge at the top = %s, want 18446744074s", got)
	}
	// The retention an operator writes for "forever".
	cfg, err := config.Parse([]byte(queueDoc("quarantine: {retention: 2562047h}")))
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Queues[0].Quarantine
	if got := r.EventsMaxAge(); got != "18446738400s" {
		t.Errorf("EventsMaxAge for 2562047h = %s, want 18446738400s", got)
	}
	for _, d := range []time.Duration{time.Nanosecond, time.Second, time.Second + 1, 14 * 24 * time.Hour} {
		q := config.Quarantine{Retention: d}
		rec := strings.TrimSuffix(q.MaxAge(), "s")
		ev := strings.TrimSuffix(q.EventsMaxAge(), "s")
		if len(ev) < len(rec) || len(ev) == len(rec) && ev < rec {
			t.Errorf("retention %s: events %ss shorter than records %ss", d, ev, rec)
		}
	}
}

// The loader reports every type and duration problem of a file at once, one
// line each and by path, not only the first or all on one line.
func TestEveryDecodeProblemIsReported(t *testing.T) {
	t.Parallel()
	_, err := config.Parse([]byte(queueDoc("delivery_limit: lots\nmax_length: many\nconsumer: {handler_timeout: soon}\nretry: {max_elapsed: later}")))
	es, ok := config.AsErrors(err)
	if !ok {
		t.Fatalf("got %v, want Errors", err)
	}
	got := map[string]string{}
	for _, e := range es {
		got[e.Path] = e.Msg
	}
	for _, p := range []string{"queues[0].delivery_limit", "queues[0].max_length", "queues[0].consumer.handler_timeout", "queues[0].retry.max_elapsed"} {
		if _, ok := got[p]; !ok {
			t.Errorf("no problem reported at %s; got:\n%v", p, err)
		}
	}
	if len(es) != 4 {
		t.Errorf("got %d problems, want 4:\n%v", len(es), err)
	}
}

// A retry tier the broker's timers cannot hold, or one longer than the time
// budget (so never used), is refused at load with a reason.
func TestRetryTiersThatCannotWork(t *testing.T) {
	t.Parallel()
	for extra, want := range map[string]string{
		"retry: {tiers: [1s, 1194h], jitter: 0, max_elapsed: 0}":   "over the broker's limit",
		"retry: {tiers: [1s, 1000h], jitter: 0.5, max_elapsed: 0}": "over the broker's limit",
	} {
		_, err := config.Parse([]byte(queueDoc(extra)))
		if err == nil || !strings.Contains(err.Error(), "queues[0].retry.tiers[1]: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want tiers[1] %q", extra, err, want)
		}
	}
	if _, err := config.Parse([]byte(queueDoc("retry: {tiers: [1s, 1193h], jitter: 0, max_elapsed: 0}"))); err != nil {
		t.Errorf("a tier under the limit: %v", err)
	}
	// A tier past the time budget is never waited: a warning, since such
	// configs loaded before.
	cfg, err := config.Parse([]byte(queueDoc("retry: {tiers: [1s, 20m], max_elapsed: 15m}")))
	if err != nil {
		t.Fatal(err)
	}
	if ws := cfg.Warnings(); len(ws) != 1 || ws[0].Path != "queues[0].retry.tiers[1]" || !strings.Contains(ws[0].Msg, "longer than retry.max_elapsed") {
		t.Errorf("warnings = %v, want one on tiers[1]", ws)
	}
	if cfg, _ := config.Parse([]byte(queueDoc(""))); len(cfg.Warnings()) != 0 {
		t.Errorf("the defaults warn: %v", cfg.Warnings())
	}
}

func TestRunAllowedHosts(t *testing.T) {
	t.Parallel()
	ok := "run: {allowed_hosts: [console.example, \"proxy.example:8443\", \"[::1]:9180\", \"::1\", 10.0.0.1]}\n"
	if _, err := config.Parse([]byte(queueDoc("") + ok)); err != nil {
		t.Errorf("valid allowed_hosts: %v", err)
	}
	for _, bad := range []string{"\"\"", "\"http://x\"", "\"x:99999\"", "\"a b\"", "\"x:y:z\""} {
		_, err := config.Parse([]byte(queueDoc("") + "run: {allowed_hosts: [" + bad + "]}\n"))
		if err == nil || !strings.Contains(err.Error(), "run.allowed_hosts[0]") {
			t.Errorf("allowed_hosts [%s]: %v", bad, err)
		}
	}
}
