package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
)

// The commonest producer bug, a missing schema-version header: the gate
// quarantines the message, a plain replay is refused naming the option
// that repairs it, and a replay with --set-header sends it back to be
// handled, the repair written in the audit trail.
func TestReplaySetHeaderRepairsAMissingVersion(t *testing.T) {
	t.Parallel()
	b, cfg := setupQuarantine(t, nil)
	q := &cfg.Queues[0]
	registry, err := schemas.Load(schemas.LoadOptions{Dir: cfg.Schemas.Dir})
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan string, 4)
	c, err := consumer.New(&consumer.Config{URL: b.env.URL, File: cfg, Registry: registry, ConnectionName: b.env.Name("repair-runtime")})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Handle(q.Name, "test.event", consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) error {
		handled <- m.MessageID
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("runtime: %v", err)
		}
	})

	ch := b.env.Channel("producer")
	if err := ch.PublishWithContext(context.Background(), "", q.Name, true, false, amqp.Publishing{
		MessageId: "no-version-1", Type: "test.event", ContentType: "application/json", Body: []byte(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	// The runtime's keeper stores the record: poll the stream (a broker's
	// state has no event to wait on).
	conn, err := amqpx.Dial(b.env.URL, b.env.Name("repair-inspect"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	in := &quarantine.Inspector{Conn: conn, Config: cfg}
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := in.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if recs := s.List(quarantine.Filter{Queue: q.Name}); len(recs) == 1 {
			if recs[0].Envelope.Class != "schema" {
				t.Fatalf("quarantined as %s, want schema: %+v", recs[0].Envelope.Class, recs[0].Envelope)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the message without a version was not quarantined within 30s")
		}
		time.Sleep(200 * time.Millisecond)
	}

	cfgFlag := []string{"--config", b.config}
	code, out, errOut := b.run(t, append([]string{"quarantine", "replay", "--queue", q.Name, "--reason", "plain"}, cfgFlag...)...)
	if code != cli.ExitFail || !strings.Contains(out+errOut, "--set-header schema-version=V") || !strings.Contains(out+errOut, "--set-version V") {
		t.Fatalf("plain replay: exit %d, want %d naming --set-version / --set-header:\n%s\n%s", code, cli.ExitFail, out, errOut)
	}
	for _, bad := range [][]string{{"--set-header", "x-death=1"}, {"--set-header", "dlxbridge-attempts=1"}, {"--set-header", "novalue"},
		{"--set-header", "a=1\r\nb: 2"}} {
		if code, _, errOut := b.run(t, append(append([]string{"quarantine", "replay", "--queue", q.Name}, bad...), cfgFlag...)...); code != cli.ExitUsage {
			t.Errorf("replay %v: exit %d, want %d (usage)\n%s", bad, code, cli.ExitUsage, errOut)
		}
	}
	if code, out, errOut := b.run(t, append([]string{"quarantine", "replay", "--queue", q.Name, "--set-version", "1", "--set-header", "schema-version=2", "--reason", "both"}, cfgFlag...)...); code != cli.ExitFail || !strings.Contains(out+errOut, "both set the version") {
		t.Errorf("--set-version with --set-header of the same header: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, out, errOut := b.run(t, append([]string{"quarantine", "replay", "--queue", q.Name, "--set-header", "schema-version=9", "--reason", "wrong"}, cfgFlag...)...); code != cli.ExitFail || !strings.Contains(out+errOut, "not in the schema registry") {
		t.Fatalf("a repair that still fails the schema: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = b.run(t, append([]string{"quarantine", "replay", "--queue", q.Name, "--set-header", "schema-version=1", "--reason", "producer forgot the version"}, cfgFlag...)...)
	if code != cli.ExitOK || !strings.Contains(out, "replayed 1 of 1 selected") {
		t.Fatalf("repaired replay: exit %d\n%s\n%s", code, out, errOut)
	}
	select {
	case id := <-handled:
		if id != "no-version-1" {
			t.Fatalf("handled %q", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the repaired message was not handled within 30s")
	}
	if audit := b.mustRun(t, cli.ExitOK, append([]string{"quarantine", "audit", "--wide"}, cfgFlag...)...); !strings.Contains(audit, "set-header schema-version=1") {
		t.Errorf("the audit trail does not say what the replay repaired:\n%s", audit)
	}
}
