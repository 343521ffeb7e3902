package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/quarantine"
)

// setupQuarantine is a CLI bundle whose work queue's quarantine holds n
// records per fingerprint, stored by a keeper as the runtime would.
func setupQuarantine(t *testing.T, perFingerprint map[string]int) (*topoBundle, *config.Config) {
	t.Helper()
	b := setupTopology(t, "")
	// test.event v1: any object with an integer n.
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "test.event"), 0o755); err != nil {
		t.Fatal(err)
	}
	schema := `{"type":"object","required":["n"],"properties":{"n":{"type":"integer"}}}`
	if err := os.WriteFile(filepath.Join(dir, "test.event", "v1.json"), []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(b.config)
	if err != nil {
		t.Fatal(err)
	}
	doc = append([]byte(fmt.Sprintf("schemas:\n  dir: %q\n", dir)), doc...)
	if err := os.WriteFile(b.config, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	b.mustRun(t, cli.ExitOK, "topology", "apply", "--config", b.config)
	cfg, err := config.Load(b.config)
	if err != nil {
		t.Fatal(err)
	}
	q := &cfg.Queues[0]
	ch := b.env.Channel("producer")
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1024))
	total := 0
	for fp, n := range perFingerprint {
		for i := 0; i < n; i++ {
			h := amqp.Table{"schema-version": "1"}
			(&quarantine.Envelope{Source: quarantine.SourceBridge, Class: "permanent", Reason: "refused", Error: "no " + fp,
				Fingerprint: fp, Attempts: 1, QuarantinedAt: time.Now(), OriginalQueue: q.Name}).Apply(h)
			err := ch.PublishWithContext(context.Background(), "", q.Quarantine.Queue, true, false, amqp.Publishing{
				MessageId: fmt.Sprintf("%s-%d", fp, i), Type: "test.event", ContentType: "application/json", Headers: h,
				Body: []byte(fmt.Sprintf(`{"n":%d}`, i))})
			if err != nil {
				t.Fatal(err)
			}
			<-confirms
			total++
		}
	}
	keep(t, b.env, cfg, total)
	return b, cfg
}

// keep runs a keeper until the records stream holds want records. (A
// quorum queue's depth counts ready messages only, not those the keeper
// holds unacked.)
func keep(t *testing.T, env *brokertest.Env, cfg *config.Config, want int) {
	t.Helper()
	keepRedacting(t, env, cfg, want, quarantine.Redaction{})
}

// keepRedacting is keep with a keeper that applies red to what it stores.
func keepRedacting(t *testing.T, env *brokertest.Env, cfg *config.Config, want int, red quarantine.Redaction) {
	t.Helper()
	q := &cfg.Queues[0]
	ctx, cancel := context.WithCancel(context.Background())
	k := &quarantine.Keeper{Consume: env.Dial("keeper"), Publish: env.Dial("keeper-pub"), Intake: q.Quarantine.Queue,
		Records: q.Quarantine.RecordsStream(), Redaction: red}
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() { cancel(); <-done }()
	in := &quarantine.Inspector{Conn: env.Dial("keep-check"), Config: cfg}
	deadline := time.Now().Add(30 * time.Second)
	for {
		snap, err := in.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Records) >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("keeper stored %d of %d", len(snap.Records), want)
		}
		time.Sleep(50 * time.Millisecond) // polling the broker: no event to wait on
	}
}

func TestQuarantineCommands(t *testing.T) {
	t.Parallel()
	b, cfg := setupQuarantine(t, map[string]int{"fp-a": 6, "fp-b": 3, "fp-c": 1})
	cfgFlag := []string{"--config", b.config}
	run := func(code int, args ...string) string { return b.mustRun(t, code, append(args, cfgFlag...)...) }

	var stats struct {
		Groups []quarantine.Group `json:"groups"`
	}
	if err := json.Unmarshal([]byte(run(cli.ExitOK, "quarantine", "stats", "--output", "json")), &stats); err != nil {
		t.Fatal(err)
	}
	if len(stats.Groups) != 3 || stats.Groups[0].Fingerprint != "fp-a" || stats.Groups[0].Open != 6 || stats.Groups[2].Open != 1 {
		t.Fatalf("stats %+v", stats.Groups)
	}
	text := run(cli.ExitOK, "quarantine", "stats")
	if !strings.Contains(text, "total: 10 open, 0 replayed, 0 purged, 0 expired") {
		t.Fatalf("stats text:\n%s", text)
	}
	var list struct {
		Total   int               `json:"total"`
		Records []json.RawMessage `json:"records"`
	}
	if err := json.Unmarshal([]byte(run(cli.ExitOK, "quarantine", "list", "--fingerprint", "fp-b", "--output", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if list.Total != 3 {
		t.Fatalf("list fp-b: %d", list.Total)
	}
	var first struct {
		ID      string `json:"id"`
		Payload string `json:"payload"`
	}
	if err := json.Unmarshal(list.Records[0], &first); err != nil || first.ID == "" || !strings.HasPrefix(first.Payload, `{"n":`) {
		t.Fatalf("record json %s: %v", list.Records[0], err)
	}
	show := run(cli.ExitOK, "quarantine", "show", first.ID[:6])
	for _, want := range []string{first.ID, "fingerprint", "fp-b", "payload ("} {
		if !strings.Contains(show, want) {
			t.Fatalf("show lacks %q:\n%s", want, show)
		}
	}
	run(cli.ExitFail, "quarantine", "show", "ffffffffffff")
	// These envelopes were stored by a keeper without the consumers' key:
	// show, list and the JSON say they are the message's claim.
	if !strings.Contains(show, "NOT verified") {
		t.Errorf("show does not mark an unverified envelope:\n%s", show)
	}
	if js := run(cli.ExitOK, "quarantine", "show", first.ID, "--output", "json"); !strings.Contains(js, `"verified": false`) {
		t.Errorf("show JSON lacks verified: false:\n%s", js)
	}
	if rows := strings.Split(run(cli.ExitOK, "quarantine", "list", "--fingerprint", "fp-b"), "\n"); len(rows) < 2 || strings.Fields(rows[1])[2] != "permanent?" {
		t.Errorf("list does not mark an unverified envelope's class:\n%s", strings.Join(rows, "\n"))
	}

	// Replay and purge never select everything.
	if code, _, errOut := b.run(t, append([]string{"quarantine", "replay"}, cfgFlag...)...); code != cli.ExitUsage || !strings.Contains(errOut, "selector") {
		t.Fatalf("replay without selector: exit %d, %s", code, errOut)
	}
	run(cli.ExitUsage, "quarantine", "purge", "--fingerprint", "fp-c")
	dry := run(cli.ExitOK, "quarantine", "replay", "--fingerprint", "fp-b", "--dry-run")
	if !strings.Contains(dry, "dry run: 3 selected, 3 would be sent; nothing changed") {
		t.Fatalf("dry run:\n%s", dry)
	}
	// A replay that selects nothing names no job: there is none to follow.
	if none := run(cli.ExitOK, "quarantine", "replay", "--fingerprint", "fp-nosuch", "--reason", "typo"); strings.Contains(none, "quarantine jobs") || !strings.Contains(none, "nothing selected") {
		t.Errorf("a replay that selected nothing:\n%s", none)
	}
	code, out, errOut := b.run(t, append([]string{"quarantine", "replay", "--fingerprint", "fp-b", "--reason", "fixed in 1.2.4", "--rate", "100"}, cfgFlag...)...)
	if code != cli.ExitOK || !strings.Contains(out, "replayed 3 of 3 selected") {
		t.Fatalf("replay: exit %d\n%s\n%s", code, out, errOut)
	}
	// The replay names its job and the command that follows it.
	if !regexp.MustCompile(`job (\S+): what became of them: dlxbridge quarantine jobs (\S+)\n`).MatchString(out) {
		t.Errorf("replay does not point at its job:\n%s", out)
	}
	// Without the consumers' key the replay says what that costs.
	if os.Getenv(config.DefaultSigningKeyEnv) == "" && !strings.Contains(errOut, "$"+config.DefaultSigningKeyEnv+" is unset") {
		t.Errorf("replay without a signing key does not warn:\n%s", errOut)
	}
	// PRIOR_REPLAYS is the count the message arrived with: a record just
	// replayed still says 0 (its STATE says replayed); the JSON field keeps
	// its name.
	listed := strings.Split(strings.TrimSpace(run(cli.ExitOK, "quarantine", "list", "--fingerprint", "fp-b", "--state", "all", "--wide")), "\n")
	if want := "ID QUEUE CLASS FINGERPRINT AGE STATE PRIOR_REPLAYS MESSAGE ID REASON ERROR"; strings.Join(strings.Fields(listed[0]), " ") != want {
		t.Errorf("list heading %q, want the fields %q", listed[0], want)
	}
	// Read without the key, the replayed events are not verified: "?".
	for _, row := range listed[1:4] {
		if f := strings.Fields(row); len(f) < 7 || f[5] != "replayed?" || f[6] != "0" {
			t.Errorf("list row %q: want state replayed? (read without the key), 0 prior replays", row)
		}
	}
	if js := run(cli.ExitOK, "quarantine", "list", "--fingerprint", "fp-b", "--state", "all", "--output", "json"); !strings.Contains(js, `"redrive_count": 0`) {
		t.Errorf("list JSON lacks redrive_count:\n%s", js)
	}
	if _, errOut := b.mustRunAll(t, cli.ExitOK, append([]string{"quarantine", "purge", "--fingerprint", "fp-c", "--reason", "test data"}, cfgFlag...)...); !strings.Contains(errOut, "the events this purge writes are unsigned") {
		t.Errorf("purge without a signing key does not say its events are unsigned:\n%s", errOut)
	}
	audit := run(cli.ExitOK, "quarantine", "audit")
	for _, want := range []string{"replay-started", "replay-finished", "purged", "fixed in 1.2.4", "test data", "fingerprint=fp-c",
		"SIGNED", "?: not verified: $" + config.DefaultSigningKeyEnv + " is unset"} {
		if !strings.Contains(audit, want) {
			t.Fatalf("audit lacks %q:\n%s", want, audit)
		}
	}
	text = run(cli.ExitOK, "quarantine", "stats")
	if !strings.Contains(text, "total: 6 open, 3 replayed, 1 purged, 0 expired") {
		t.Fatalf("stats after:\n%s", text)
	}
	if st, err := b.env.Channel("depth").QueueDeclarePassive(cfg.Queues[0].Name, true, false, false, false, nil); err != nil || st.Messages != 3 {
		t.Fatalf("work queue: %+v %v", st, err)
	}
}

// A replay killed midway (SIGKILL of the CLI process) loses nothing: every
// record is either still open or its message is in the work queue, and a
// second replay sends the rest (a message sent but not yet marked may go
// twice: a duplicate, never a loss). The lock dies with the process.
func TestReplayKilledMidwayLosesNothing(t *testing.T) {
	t.Parallel()
	const n = 60
	b, cfg := setupQuarantine(t, map[string]int{"fp-k": n})
	bin := filepath.Join(t.TempDir(), "dlxbridge")
	if out, err := exec.Command("go", "build", "-o", bin, "../..").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	work := cfg.Queues[0].Name

	// Two processes listing at once, and a third after them, print the same
	// records in the same order.
	list := func() *exec.Cmd {
		c := exec.Command(bin, "quarantine", "list", "--state", "all", "--limit", "0", "--output", "json", "--config", b.config)
		c.Env = append(os.Environ(), "RABBITMQ_URL="+b.env.URL)
		return c
	}
	outs := make([][]byte, 3)
	errs := make([]error, 3)
	done := make(chan int, 2)
	for i := 0; i < 2; i++ {
		go func() { outs[i], errs[i] = list().Output(); done <- i }()
	}
	<-done
	<-done
	outs[2], errs[2] = list().Output()
	for i := range outs {
		if errs[i] != nil || string(outs[i]) != string(outs[2]) || !strings.Contains(string(outs[i]), `"total": 60`) {
			t.Fatalf("listing %d differs or failed (%v):\n%.300s\nvs\n%.300s", i, errs[i], outs[i], outs[2])
		}
	}

	cmd := exec.Command(bin, "quarantine", "replay", "--fingerprint", "fp-k", "--rate", "20", "--config", b.config)
	cmd.Env = append(os.Environ(), "RABBITMQ_URL="+b.env.URL)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := b.env.Channel("depth")
	depth := func() int {
		st, err := ch.QueueDeclarePassive(work, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return st.Messages
	}
	deadline := time.Now().Add(30 * time.Second)
	for depth() < 10 {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("the replay sent nothing: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // polling the broker: no event to wait on
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	in := &quarantine.Inspector{Conn: b.env.Dial("inspect"), Config: cfg}
	snap, err := in.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sent := map[string]int{}
	get := b.env.Channel("get")
	for {
		d, ok, err := get.Get(work, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		sent[d.MessageId]++
	}
	open := 0
	for _, r := range snap.Records {
		if r.State == quarantine.StateOpen {
			open++
			continue
		}
		if sent[r.Properties.MessageID] == 0 {
			t.Errorf("%s (%s) marked %s but not in the work queue: lost", r.ID, r.Properties.MessageID, r.State)
		}
	}
	t.Logf("killed after %d sent; %d open", len(sent), open)
	if open == 0 || open == n {
		t.Fatalf("kill did not land midway: %d open", open)
	}
	// The lock died with the process: a second replay runs at once and
	// sends what is still open.
	out := b.mustRun(t, cli.ExitOK, "quarantine", "replay", "--fingerprint", "fp-k", "--lock-wait", "0s", "--config", b.config)
	if !strings.Contains(out, fmt.Sprintf("replayed %d of %d selected", open, open)) {
		t.Fatalf("second replay:\n%s", out)
	}
}

// quarantine list -h says what each column counts; PRIOR_REPLAYS (once
// REDRIVES) was read as "times this record was replayed".
func TestQuarantineListHelpSaysWhatItsColumnsCount(t *testing.T) {
	t.Parallel()
	code, help, _ := runCLI(t, "", "quarantine", "list", "-h")
	if code != cli.ExitOK {
		t.Fatalf("list -h: exit %d\n%s", code, help)
	}
	for _, want := range []string{"PRIOR_REPLAYS", "before it came into the quarantine this time", "dlxbridge-redrive-count", "max_redrives", "STATE"} {
		if !strings.Contains(help, want) {
			t.Errorf("list -h lacks %q:\n%s", want, help)
		}
	}
}

// A message in the intake that no keeper stored yet is not a record: list
// says it waits there, as stats does, rather than "0 of 0 record(s)" alone.
func TestQuarantineListSaysWhatWaitsInTheIntake(t *testing.T) {
	t.Parallel()
	b, cfg := setupQuarantine(t, map[string]int{"fp-a": 1})
	q := &cfg.Queues[0]
	ch := b.env.Channel("late-producer")
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	if err := ch.PublishWithContext(context.Background(), "", q.Quarantine.Queue, true, false, amqp.Publishing{
		MessageId: "waiting", Body: []byte(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	if c := <-confirms; !c.Ack {
		t.Fatal("publish to the intake nacked")
	}
	want := fmt.Sprintf("intake %s: 1 message(s) not yet stored (is the runtime running?)", q.Quarantine.Queue)
	for _, cmd := range []string{"list", "stats"} {
		out := b.mustRun(t, cli.ExitOK, "quarantine", cmd, "--config", b.config)
		if !strings.Contains(out, want) {
			t.Errorf("quarantine %s:\n%s\nwant a line %q", cmd, out, want)
		}
	}
}

// With the key, an event published straight into the events stream
// through the default exchange (any user with write on amq.default can)
// after the stream's first signed event is listed by audit as UNSIGNED and
// changes nothing: the record it names stays open. The operators' signed
// purge is "yes" and resolves its record. Read without the key, both
// count, marked "?".
func TestQuarantineAuditMarksAnUnsignedEvent(t *testing.T) {
	t.Parallel()
	b, cfg := setupQuarantine(t, map[string]int{"fp-s": 1, "fp-f": 1})
	const key = "the operators' key, 32 bytes...."
	keyedWith := func(key string, code int, args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		env := &cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
			switch k {
			case "RABBITMQ_URL":
				return b.env.URL
			case config.DefaultSigningKeyEnv:
				return key
			}
			return ""
		}}
		if got := cli.Main(context.Background(), append(args, "--config", b.config), env); got != code {
			t.Fatalf("dlxbridge %s: exit %d, want %d\n%s\n%s", strings.Join(args, " "), got, code, out.String(), errOut.String())
		}
		return out.String()
	}
	keyed := func(code int, args ...string) string { t.Helper(); return keyedWith(key, code, args...) }
	keyed(cli.ExitOK, "quarantine", "purge", "--fingerprint", "fp-s", "--reason", "signed by the operators")
	var list struct {
		Records []quarantine.Record `json:"records"`
	}
	if err := json.Unmarshal([]byte(keyed(cli.ExitOK, "quarantine", "list", "--fingerprint", "fp-f", "--output", "json")), &list); err != nil || len(list.Records) != 1 {
		t.Fatalf("list fp-f: %+v %v", list, err)
	}
	target := list.Records[0].ID
	body, _ := json.Marshal(quarantine.Event{Kind: quarantine.EventPurged, At: time.Now().UTC(), By: "alice@ops-host",
		Reason: "forged", Run: "f0f0f0f0f0f0", IDs: []string{target}})
	ch := b.env.Channel("forger")
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	if err := ch.PublishWithContext(context.Background(), "", cfg.Queues[0].Quarantine.EventsStream(), true, false, amqp.Publishing{Body: body}); err != nil {
		t.Fatal(err)
	}
	<-confirms

	audit := keyed(cli.ExitOK, "quarantine", "audit", "--wide") // AT QUARANTINE KIND SIGNED BY …
	rows := map[string][]string{}
	for _, line := range strings.Split(audit, "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[2] == quarantine.EventPurged) {
			rows[f[4]] = f
		}
	}
	if f := rows["alice@ops-host"]; f == nil || f[3] != "UNSIGNED" {
		t.Errorf("the forged event is not marked UNSIGNED:\n%s", audit)
	}
	if !strings.Contains(audit, "UNSIGNED: 1 event(s)") {
		t.Errorf("audit does not say what UNSIGNED means:\n%s", audit)
	}
	for by, f := range rows {
		if by != "alice@ops-host" && f[3] != "yes" {
			t.Errorf("the operators' purge is %s, want yes:\n%s", f[3], audit)
		}
	}
	if len(rows) != 2 {
		t.Fatalf("%d purged events listed, want 2:\n%s", len(rows), audit)
	}
	if strings.Contains(audit, "KEY:") {
		t.Errorf("audit with the right key says the key is wrong:\n%s", audit)
	}
	// A mistyped key is told so, not read as no key.
	if wrong := keyedWith("a mistyped key, also 32 bytes...", cli.ExitOK, "quarantine", "audit"); !strings.Contains(wrong, "KEY: none of the") {
		t.Errorf("audit with a key that signed nothing does not say so:\n%s", wrong)
	}
	state := func(out string) string {
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 5 && f[0] == target {
				return f[5]
			}
		}
		return ""
	}
	if st := state(keyed(cli.ExitOK, "quarantine", "list", "--state", "all", "--wide")); st != "open" {
		t.Errorf("with the key the record the forged event names is %q, want open", st)
	}
	if st := state(b.mustRun(t, cli.ExitOK, "quarantine", "list", "--state", "all", "--wide", "--config", b.config)); st != "purged?" {
		t.Errorf("without the key the record the forged event names is %q, want purged? (counted, not verified)", st)
	}
}

// A typo in a selector is said, not answered with "0 selected": a class
// that does not exist is refused before anything is read; a queue the
// config does not name is warned about (its records may outlive it).
func TestQuarantineSelectorTyposAreSaid(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join("..", "..", "..", "..", "config.yaml")
	code, _, errOut := runCLI(t, "", "quarantine", "replay", "--config", cfg, "--class", "bogus")
	if code != cli.ExitUsage || !strings.Contains(errOut, `--class "bogus" is not a failure class`) || !strings.Contains(errOut, "crash-loop") {
		t.Errorf("--class bogus: exit %d, stderr %q; want %d naming the classes", code, errOut, cli.ExitUsage)
	}
	code, _, errOut = runCLI(t, "", "quarantine", "list", "--config", cfg, "--queue", "nosuch.queue", "--url", "amqp://guest:guest@127.0.0.1:1/")
	if code == cli.ExitOK || !strings.Contains(errOut, `warning: --queue "nosuch.queue" is none of the config's queues (orders`) {
		t.Errorf("--queue nosuch.queue: exit %d, stderr %q; want a warning naming the config's queues", code, errOut)
	}
	if code, _, errOut = runCLI(t, "", "quarantine", "list", "--config", cfg, "--queue", "orders", "--url", "amqp://guest:guest@127.0.0.1:1/"); strings.Contains(errOut, "warning") {
		t.Errorf("--queue orders: stderr %q; want no warning for a configured queue", errOut)
	}
}

// A signing key that is set but too short is a setup mistake: exit 2
// before any connection is tried, naming the variable, never the key.
func TestQuarantineCommandsRefuseAnUnusableKey(t *testing.T) {
	t.Parallel()
	const short = "tooshort"
	for _, args := range [][]string{{"quarantine", "list"}, {"quarantine", "jobs"}, {"quarantine", "replay", "--class", "schema"}} {
		var out, errOut bytes.Buffer
		code := cli.Main(context.Background(), append(args, "--config", filepath.Join("..", "..", "..", "..", "config.yaml"), "--url", "amqp://guest:guest@127.0.0.1:1/"), &cli.Env{
			Stdout: &out, Stderr: &errOut, Stdin: strings.NewReader(""),
			Getenv: func(k string) string {
				if k == "DLXBRIDGE_SIGNING_KEY" {
					return short
				}
				return ""
			},
		})
		if code != cli.ExitUsage || !strings.Contains(errOut.String(), "$DLXBRIDGE_SIGNING_KEY") || strings.Contains(errOut.String(), short) || strings.Contains(errOut.String(), "127.0.0.1:1") {
			t.Errorf("%v: exit %d, stderr %q; want %d naming the variable, before connecting", args, code, errOut.String(), cli.ExitUsage)
		}
	}
}
