package sidecar

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// runtimeWrite is the write permission docs/quarantine.md gives the
// runtime's user: everything (amq.default included: the keeper and
// re-admissions write through it) but names ending in .records or .events.
const runtimeWrite = `^(?!.*\.(records|events)$).*$`

// `dlxbridge run` warns once, at start, when its broker user may write the
// quarantine's streams by name: guest (write .*) may, naming the user, the
// vhost and both streams; a user with the documented write permission may
// not, and runs without the warning (and without an INFO line saying it
// could not tell).
func TestRunWarnsWhenItsUserMayWriteTheStreams(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(srv.Close)
	cfgPath := writeSidecarConfig(t, env, srv.URL+"/work", 1)
	records, events := env.Name("work.quarantine")+".records", env.Name("work.quarantine")+".events"
	const warning = "may write the quarantine's streams by name"

	guest := startSidecarOn(t, env, cfgPath)
	log := guest.stderr.String()
	var lines []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, warning) {
			lines = append(lines, line)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d warnings for guest, want 1:\n%s", len(lines), log)
	}
	for _, want := range []string{"level=WARN", "user=guest", "vhost=/", `streams="` + records + " " + events + `"`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("the warning lacks %s:\n%s", want, lines[0])
		}
	}

	mine := "^" + regexp.QuoteMeta(env.Prefix) + `\.`
	restricted := env.User(brokertest.Permissions{Configure: mine, Write: runtimeWrite, Read: mine})
	p := startSidecarAs(t, env, restricted, cfgPath)
	if log := p.stderr.String(); strings.Contains(log, warning) || strings.Contains(log, "could not check") {
		t.Errorf("a user with the documented write permission is warned about:\n%s", log)
	}
}

// When the broker's answer says neither yes nor no (here: the connection
// is gone), the check says so in one INFO line and warns of nothing.
func TestStreamWriteCheckSaysWhenItCannotTell(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	conn := env.Dial("probe")
	_ = conn.Close()
	cfg := &config.Config{Queues: []config.Queue{
		{Name: "a", Quarantine: config.Quarantine{Queue: "shared.quarantine"}},
		{Name: "b", Quarantine: config.Quarantine{Queue: "shared.quarantine"}},
	}}
	if got := quarantineStreams(cfg); strings.Join(got, " ") != "shared.quarantine.records shared.quarantine.events" {
		t.Fatalf("streams of a shared quarantine: %q", got)
	}
	var out strings.Builder
	warnStreamWriters(conn, env.URL, cfg, slog.New(slog.NewTextHandler(&out, nil)))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=INFO") || !strings.Contains(lines[0], "could not check") {
		t.Fatalf("want one INFO line, got:\n%s", out.String())
	}
}
