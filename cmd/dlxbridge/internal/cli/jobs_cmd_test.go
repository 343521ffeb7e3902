package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/quarantine"
)

// quarantine jobs lists every replay as a job (a table of 100 columns, or
// JSON), shows one job's messages, and jobs cancel stops a running one
// after the message in flight: it ends cancelled, the rest open.
func TestQuarantineJobs(t *testing.T) {
	t.Parallel()
	b, _ := setupQuarantine(t, map[string]int{"fp-a": 3, "fp-b": 5})
	cfgFlag := []string{"--config", b.config}
	run := func(code int, args ...string) string { return b.mustRun(t, code, append(args, cfgFlag...)...) }
	jobs := func() []quarantine.Job {
		var out struct {
			Jobs []quarantine.Job `json:"jobs"`
		}
		if err := json.Unmarshal([]byte(run(cli.ExitOK, "quarantine", "jobs", "--output", "json")), &out); err != nil {
			t.Fatal(err)
		}
		return out.Jobs
	}
	if got := run(cli.ExitOK, "quarantine", "jobs"); got != "no replay jobs\n" {
		t.Errorf("jobs before any replay: %q", got)
	}
	var res quarantine.ReplayResult
	if err := json.Unmarshal([]byte(run(cli.ExitOK, "quarantine", "replay", "--fingerprint", "fp-a", "--output", "json")), &res); err != nil {
		t.Fatal(err)
	}
	text := run(cli.ExitOK, "quarantine", "jobs")
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		if utf8.RuneCountInString(line) > 100 {
			t.Errorf("a line of %d columns:\n%s", utf8.RuneCountInString(line), line)
		}
	}
	if !strings.Contains(text, res.Run) || !strings.Contains(text, "done") || !strings.Contains(text, "CONFIRMED") {
		t.Errorf("jobs:\n%s", text)
	}
	// No runtime consumes the work queue: every message is pending.
	if js := jobs(); len(js) != 1 || js[0].ID != res.Run || js[0].State != quarantine.JobDone || js[0].Selected != 3 ||
		js[0].Confirmed != 3 || js[0].Pending != 3 || js[0].Handled != 0 {
		t.Errorf("jobs JSON: %+v", js)
	}
	one := run(cli.ExitOK, "quarantine", "jobs", res.Run[:6])
	if strings.Count(one, "pending") != 3 || !strings.Contains(one, "RECORD") {
		t.Errorf("jobs ID:\n%s", one)
	}
	run(cli.ExitFail, "quarantine", "jobs", "cancel", res.Run) // done: nothing to cancel
	run(cli.ExitFail, "quarantine", "jobs", "ffffffffffff")    // no such job
	// Too short a prefix never matches, and the error says why.
	if code, _, errOut := b.run(t, append([]string{"quarantine", "jobs", res.Run[:2]}, cfgFlag...)...); code != cli.ExitFail || !strings.Contains(errOut, "at least 4 characters") {
		t.Errorf("jobs %s: exit %d, stderr %q; want %d saying a prefix needs 4 characters", res.Run[:2], code, errOut, cli.ExitFail)
	}
	run(cli.ExitUsage, "quarantine", "jobs", "cancel") // which one?

	// A slow replay, cancelled while it runs.
	done := make(chan string, 1)
	go func() {
		code, out, errOut := b.run(t, append([]string{"quarantine", "replay", "--fingerprint", "fp-b", "--rate", "1"}, cfgFlag...)...)
		done <- strings.Join([]string{string(rune('0' + code)), out, errOut}, "\n")
	}()
	var running *quarantine.Job
	for deadline := time.Now().Add(30 * time.Second); running == nil; {
		for _, j := range jobs() {
			if j.State == quarantine.JobRunning && j.Confirmed >= 1 {
				running = &j
			}
		}
		if running == nil && time.Now().After(deadline) {
			t.Fatal("the slow replay never showed as running")
		}
		time.Sleep(200 * time.Millisecond) // polling the broker
	}
	if out := run(cli.ExitOK, "quarantine", "jobs", "cancel", running.ID, "--reason", "wrong group"); !strings.Contains(out, "asked job "+running.ID) {
		t.Errorf("cancel: %q", out)
	}
	select {
	case out := <-done:
		if !strings.HasPrefix(out, string(rune('0'+cli.ExitFail))) || !strings.Contains(out, "cancelled (quarantine jobs cancel); the rest stay open") {
			t.Errorf("the cancelled replay:\n%s", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled replay did not stop")
	}
	for _, j := range jobs() {
		if j.ID == running.ID && (j.State != quarantine.JobCancelled || j.Confirmed == 0 || j.Confirmed >= 5 || !strings.Contains(j.Stop, "cancelled")) {
			t.Errorf("cancelled job: %+v", j)
		}
	}
}
