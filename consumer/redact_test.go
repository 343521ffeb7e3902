package consumer

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
)

// piiSchema asserts a format and a bound on the fields the redaction tests
// redact, so a failing value could be quoted by a violation.
const piiSchema = `{
  "type": "object",
  "required": ["id"],
  "properties": {
    "id": {"type": "string"},
    "email": {"type": "string", "format": "email"},
    "n": {"type": "integer", "maximum": 100}
  }
}`

// setupRedacting is setup with /email and /n redacted, the given schema for
// versions 1 and 2, and a debug log captured in the returned buffer.
func setupRedacting(t *testing.T, v1, v2 string) (*testBundle, *syncBuffer) {
	t.Helper()
	b := setup(t, func(q *config.Queue) {
		q.Quarantine.Redact.Fields = []string{"/email", "/n"}
	})
	for v, s := range map[string]string{"v1.json": v1, "v2.json": v2} {
		if err := os.WriteFile(filepath.Join(b.file.Schemas.Dir, testType, v), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := schemas.Load(schemas.LoadOptions{Dir: b.file.Schemas.Dir})
	if err != nil {
		t.Fatal(err)
	}
	b.registry, b.cfg.Registry = reg, reg
	logs := &syncBuffer{}
	b.cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return b, logs
}

// drainQuarantineByID takes n messages off the quarantine, by message id.
func (b *testBundle) drainQuarantineByID(n int) map[string]amqp.Delivery {
	b.t.Helper()
	got := map[string]amqp.Delivery{}
	for _, d := range b.drainQuarantine(n) {
		got[d.MessageId] = d
	}
	return got
}

// leaks lists the secrets found anywhere in a quarantined message's headers
// or body, or in the log.
// Secrets are long and distinctive: a short number such as 4712 turns up by
// chance in a trace id or a log line's nanoseconds (a CI run once failed so).
func leaks(d amqp.Delivery, logs string, secrets ...string) []string {
	var all strings.Builder
	all.Write(d.Body)
	for k, v := range d.Headers {
		all.WriteString(k)
		if s, ok := v.(string); ok {
			all.WriteString(s)
		}
	}
	all.WriteString(logs)
	var found []string
	for _, s := range secrets {
		if strings.Contains(all.String(), s) {
			found = append(found, s)
		}
	}
	return found
}

// An upcaster whose output fails a format or maximum check on a redacted
// field: the value appears neither in the envelope's error and validation
// headers nor in the log, and doesn't feed the fingerprint (two values, one
// fingerprint).
func TestUpcastFailureNeverQuotesRedactedValues(t *testing.T) {
	t.Parallel()
	b, logs := setupRedacting(t, `{"type":"object","required":["id"]}`, piiSchema)
	b.start(func(c *Consumer) {
		must(t, c.HandleVersion(b.queue.Name, testType, "2", HandlerFunc(func(ctx context.Context, m *Message) error {
			t.Error("the handler ran on invalid upcast data")
			return nil
		})))
		must(t, c.Upcast(testType, "1", "2", func(data any) (any, error) { return data, nil }))
	})
	b.publish([]byte(`{"id":"u-1","email":"secret-one","n":47114711471}`), amqp.Publishing{MessageId: "u-1"})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	b.publish([]byte(`{"id":"u-2","email":"secret-two","n":47124712471}`), amqp.Publishing{MessageId: "u-2"})
	b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	got := b.drainQuarantineByID(2)
	var prints []string
	for _, id := range []string{"u-1", "u-2"} {
		d := got[id]
		env, _ := quarantine.Read(&d)
		if !strings.Contains(env.Error, "/email format") || env.Fingerprint == "" {
			t.Errorf("%s: error %q fingerprint %q", id, env.Error, env.Fingerprint)
		}
		if found := leaks(d, logs.String(), "secret-one", "secret-two", "47114711471", "47124712471"); len(found) > 0 {
			t.Errorf("%s: %v leaked (error %q)", id, found, env.Error)
		}
		prints = append(prints, env.Fingerprint)
	}
	if prints[0] != prints[1] {
		t.Errorf("fingerprints %v differ: the value fed them", prints)
	}
}

// The gate's violations on the original body, a body with trailing data,
// and a body over max_body_bytes: each is quarantined without any
// redacted value escaping, or, for the last, kept as received with a note.
func TestQuarantinedSchemaFailuresKeepRedactedValuesIn(t *testing.T) {
	t.Parallel()
	b, logs := setupRedacting(t, piiSchema, piiSchema)
	b.file.Schemas.MaxBodyBytes = 512
	b.start(func(c *Consumer) {
		must(t, c.Handle(b.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error {
			t.Errorf("the handler ran on %s", m.Body)
			return nil
		})))
	})
	bodies := map[string]string{
		"invalid":  `{ "id":"g-1", "email" : "secret-one","n":47114711471 }`,
		"trailing": `{"id":"g-2"} {"email":"secret-two","n":47124712471}`,
		"too-big":  `{"id":"g-3","email":"secret-three","pad":"` + strings.Repeat("x", 512) + `"}`,
	}
	for _, id := range []string{"invalid", "trailing", "too-big"} {
		b.publish([]byte(bodies[id]), amqp.Publishing{MessageId: id})
		b.waitOutcome(OutcomeQuarantined, 10*time.Second)
	}
	got := b.drainQuarantineByID(3)

	want := map[string]string{
		"invalid":  `{ "id":"g-1", "email" : "[redacted]","n":"[redacted]" }`,
		"trailing": `{"id":"g-2"} {"email":"[redacted]","n":"[redacted]"}`,
	}
	for id, body := range want {
		d := got[id]
		env, _ := quarantine.Read(&d)
		if string(d.Body) != body || env.RedactionFailed != "" || len(env.Redacted) != 2 {
			t.Errorf("%s: body %s, redacted %v, failed %q; want body %s", id, d.Body, env.Redacted, env.RedactionFailed, body)
		}
		if found := leaks(d, logs.String(), "secret-one", "secret-two", "47114711471", "47124712471"); len(found) > 0 {
			t.Errorf("%s: %v leaked (error %q, validation %v)", id, found, env.Error, env.Validation)
		}
	}
	d := got["too-big"]
	env, _ := quarantine.Read(&d)
	if string(d.Body) != bodies["too-big"] || !strings.Contains(env.RedactionFailed, "max_body_bytes") {
		t.Errorf("too-big: failed %q, body changed: %v", env.RedactionFailed, string(d.Body) != bodies["too-big"])
	}
}
