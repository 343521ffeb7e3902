package cli_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/quarantine"
)

// A record's reason, error, headers and payload come from producers (and
// from handlers quoting them). list, show and stats print them on the
// on-call engineer's terminal: a control character there (an escape
// sequence that erases lines, rewrites the title or the clipboard) must
// reach it escaped, never as is.
func TestQuarantineTextOutputEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	b, cfg := setupQuarantine(t, nil)
	q := &cfg.Queues[0]
	const esc = "\x1b[2K\x1b]52;c;aGk=\x07"
	h := amqp.Table{"evil": "a" + esc, "schema-version": "1"}
	(&quarantine.Envelope{Source: quarantine.SourceBridge, Class: "permanent", Reason: "refused" + esc, Error: "no\r\n" + esc,
		Fingerprint: "fp" + esc, Attempts: 1, OriginalQueue: q.Name}).Apply(h)
	ch := b.env.Channel("hostile")
	if err := ch.PublishWithContext(context.Background(), "", q.Quarantine.Queue, true, false, amqp.Publishing{
		MessageId: "evil" + esc, Type: "test.event", Headers: h, Body: []byte("{\"n\":1}" + esc + "\x00\xff")}); err != nil {
		t.Fatal(err)
	}
	keep(t, b.env, cfg, 1)
	cfgFlag := []string{"--config", b.config}
	list := b.mustRun(t, cli.ExitOK, append([]string{"quarantine", "list"}, cfgFlag...)...)
	id := strings.Fields(strings.Split(list, "\n")[1])[0]
	for name, out := range map[string]string{
		"list":  list,
		"show":  b.mustRun(t, cli.ExitOK, append([]string{"quarantine", "show", id}, cfgFlag...)...),
		"stats": b.mustRun(t, cli.ExitOK, append([]string{"quarantine", "stats"}, cfgFlag...)...),
	} {
		if i := strings.IndexAny(out, "\x1b\x07\r\x00"); i >= 0 {
			t.Errorf("%s prints a control character at %d:\n%q", name, i, out)
		}
	}
}

// A negative --max or --rate is refused (exit 2), not taken as "no cap" or
// "unpaced"; the check comes before the config and the broker.
func TestReplayRefusesNegativeMaxAndRate(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"quarantine", "replay", "--queue", "q", "--rate", "-5"},
		{"quarantine", "replay", "--queue", "q", "--rate", "NaN"},
		{"quarantine", "replay", "--queue", "q", "--max", "-1"},
		{"quarantine", "purge", "--queue", "q", "--reason", "r", "--max", "-1"},
	} {
		code, _, stderr := runWith("amqp://127.0.0.1:1/", append(args, "--config", "/nonexistent.yaml")...)
		if code != cli.ExitUsage || !strings.Contains(stderr, "--max and --rate") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
}

// show prints a panic's stack as indented lines, not as one header value
// with escaped newlines and tabs. Each line is escaped on its own and
// indented: a forged stack (published straight into the quarantine) can
// neither reach the terminal with a control character nor fake a row.
func TestQuarantineShowPrintsStackAsLines(t *testing.T) {
	t.Parallel()
	b, cfg := setupQuarantine(t, nil)
	q := &cfg.Queues[0]
	const esc = "\x1b[2K\x1b]52;c;aGk=\x07"
	stack := "goroutine 7 [running]:\nmain.handle(...)\n\t/src/h.go:12 +0x1d\nevil" + esc + "\r\nstate\treplayed"
	h := amqp.Table{"schema-version": "1"}
	(&quarantine.Envelope{Source: quarantine.SourceBridge, Class: "panic", Reason: "handler panicked", Error: "boom",
		Fingerprint: "fp", Attempts: 1, OriginalQueue: q.Name, Stack: stack}).Apply(h)
	ch := b.env.Channel("panicker")
	if err := ch.PublishWithContext(context.Background(), "", q.Quarantine.Queue, true, false, amqp.Publishing{
		Type: "test.event", Headers: h, Body: []byte(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	keep(t, b.env, cfg, 1)
	cfgFlag := []string{"--config", b.config}
	list := b.mustRun(t, cli.ExitOK, append([]string{"quarantine", "list"}, cfgFlag...)...)
	id := strings.Fields(strings.Split(list, "\n")[1])[0]
	out := b.mustRun(t, cli.ExitOK, append([]string{"quarantine", "show", id}, cfgFlag...)...)
	want := "\nstack:\n  goroutine 7 [running]:\n  main.handle(...)\n  \t/src/h.go:12 +0x1d\n" +
		`  evil\x1b[2K\x1b]52;c;aGk=\a\r` + "\n  state\treplayed\npayload (7 bytes"
	if !strings.Contains(out, want) {
		t.Errorf("show does not print the stack as escaped, indented lines; want\n%q\nin\n%q", want, out)
	}
	if i := strings.IndexAny(out, "\x1b\x07\r\x00"); i >= 0 {
		t.Errorf("show prints a control character at %d:\n%q", i, out)
	}
	states := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "state") {
			states++
		}
	}
	if states != 1 {
		t.Errorf("show prints %d state rows, want 1 (a stack line faked one):\n%s", states, out)
	}
}

// show and its JSON say what the keeper redacted from a message that
// carried no verified envelope (one published straight into the
// quarantine, as the broker's dead letters arrive), and print neither
// secret.
func TestQuarantineShowSaysWhatTheKeeperRedacted(t *testing.T) {
	t.Parallel()
	b, cfg := setupQuarantine(t, nil)
	q := &cfg.Queues[0]
	ch := b.env.Channel("secret-producer")
	if err := ch.PublishWithContext(context.Background(), "", q.Quarantine.Queue, true, false, amqp.Publishing{
		Type: "test.event", Headers: amqp.Table{"authorization": "secret-auth"}, Body: []byte(`{"n":1,"card":"secret-card"}`)}); err != nil {
		t.Fatal(err)
	}
	keepRedacting(t, b.env, cfg, 1, quarantine.Redaction{Headers: []string{"authorization"}, Fields: []string{"/card"}})
	cfgFlag := []string{"--config", b.config}
	list := b.mustRun(t, cli.ExitOK, append([]string{"quarantine", "list"}, cfgFlag...)...)
	id := strings.Fields(strings.Split(list, "\n")[1])[0]
	out := b.mustRun(t, cli.ExitOK, append([]string{"quarantine", "show", id}, cfgFlag...)...)
	js := b.mustRun(t, cli.ExitOK, append([]string{"quarantine", "show", id, "--output", "json"}, cfgFlag...)...)
	if !regexp.MustCompile(`(?m)^redacted +header:authorization, body:/card$`).MatchString(out) ||
		!strings.Contains(out, "redacted by the quarantine keeper") || !regexp.MustCompile(`"redacted":\s*\[\s*"header:authorization",\s*"body:/card"\s*\]`).MatchString(js) {
		t.Errorf("show does not say what the keeper redacted:\n%s\n%s", out, js)
	}
	if strings.Contains(out+js, "secret-") {
		t.Errorf("show prints a secret:\n%s\n%s", out, js)
	}
}
