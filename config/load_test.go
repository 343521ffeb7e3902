package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
)

// queueDoc is a valid one-queue config with extra lines added to the queue.
func queueDoc(extra string) string {
	return `queues:
  - name: orders
    exchange: {name: orders}
    accepts:
      - {type: orders.created, versions: ["1"]}
` + indent(extra, "    ")
}

func indent(s, prefix string) string {
	if s == "" {
		return ""
	}
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(queueDoc("")))
	if err != nil {
		t.Fatal(err)
	}
	q := cfg.Queues[0]
	check := func(name string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("broker.connection_name", cfg.Broker.ConnectionName, config.DefaultConnectionName)
	check("broker.management_url", cfg.Broker.ManagementURL, "")
	check("schemas.max_body_bytes", cfg.Schemas.MaxBodyBytes, 1<<20)
	check("exchange.type", q.Exchange.Type, "topic")
	check("bindings", q.Bindings, []string{"orders"})
	check("delivery_limit", q.DeliveryLimit, 5)
	check("max_length", q.MaxLength, 0)
	check("consumer.prefetch", q.Consumer.Prefetch, 20)
	check("consumer.concurrency", q.Consumer.Concurrency, 4)
	check("consumer.handler_timeout", q.Consumer.HandlerTimeout, 30*time.Second)
	check("consumer.crash_loop_deliveries", q.Consumer.CrashLoopDeliveries, 4)
	check("retry.tiers", q.Retry.Tiers, []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute})
	check("retry.jitter", q.Retry.JitterValue(), 0.2)
	check("retry.lanes", q.Retry.Lanes, 4)
	check("retry.max_attempts", q.Retry.MaxAttempts, 5)
	check("retry.max_elapsed", q.Retry.MaxElapsedValue(), 15*time.Minute)
	check("retry.immediate_retries", q.Retry.ImmediateRetries, 0)
	check("policy.ImmediateRetries", q.Policy().ImmediateRetries, 0)
	check("quarantine.queue", q.Quarantine.Queue, "orders.quarantine")
	check("quarantine.retention", q.Quarantine.Retention, 336*time.Hour)
	check("message.from", q.Message.From, "properties")
	check("message.version_header", q.Message.VersionHeader, "schema-version")
	check("message.type_pointer", q.Message.TypePointer, "/type")
	check("message.version_pointer", q.Message.VersionPointer, "/schemaVersion")
	check("gate", q.Gate, config.GateEnforce)
	check("security.signing_key_env", cfg.Security.SigningKeyEnv, "DLXBRIDGE_SIGNING_KEY")
}

// The key's variable name is configurable; the key itself never is.
func TestSigningKeyEnv(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte("security: {signing_key_env: ORDERS_SIGNING_KEY}\n" + queueDoc("")))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Security.SigningKeyEnv != "ORDERS_SIGNING_KEY" {
		t.Fatalf("signing_key_env = %q", cfg.Security.SigningKeyEnv)
	}
	_, err = config.Parse([]byte("security: {signing_key: s3cr3t}\n" + queueDoc("")))
	if err == nil || !strings.Contains(err.Error(), "security.signing_key: unknown key") {
		t.Fatalf("a key in the file: got %v, want an unknown-key error", err)
	}
}

func TestDefaultsThatDependOnOtherFields(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(`queues:
  - name: alerts
    exchange: {name: alerts, type: fanout}
    delivery_limit: 1
    retry: {jitter: 0, max_elapsed: 0s}
    accepts:
      - {type: alerts.raised, versions: ["v2", "V3"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	q := cfg.Queues[0]
	if !reflect.DeepEqual(q.Bindings, []string{""}) {
		t.Errorf("fanout bindings default %q, want [\"\"]", q.Bindings)
	}
	if q.Retry.Lanes != 1 {
		t.Errorf("lanes with jitter 0 = %d, want 1", q.Retry.Lanes)
	}
	if q.Consumer.CrashLoopDeliveries != 1 {
		t.Errorf("crash_loop_deliveries with delivery_limit 1 = %d, want 1", q.Consumer.CrashLoopDeliveries)
	}
	if q.Retry.MaxElapsedValue() != 0 {
		t.Errorf("explicit max_elapsed 0 became %s", q.Retry.MaxElapsedValue())
	}
	if !reflect.DeepEqual(q.Accepts[0].Versions, []string{"2", "3"}) {
		t.Errorf("versions %q, want normalized [2 3]", q.Accepts[0].Versions)
	}
}

func TestEveryRuleNamesItsField(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, doc, path, msg string
	}{
		{"unknown top key", "queuez: []\n" + queueDoc(""), "queuez", `unknown key (did you mean "queues"?)`},
		{"unknown nested key", queueDoc("retry: {tierz: [1s]}"), "queues[0].retry.tierz", `unknown key (did you mean "tiers"?)`},
		{"unknown key, no suggestion", queueDoc("consumer: {zzzzzzzz: 1}"), "queues[0].consumer.zzzzzzzz", "unknown key"},
		{"bad duration", queueDoc("retry: {tiers: [1s, soon]}"), "queues[0].retry.tiers[1]", `"soon" is not a duration`},
		{"mapping expected", queueDoc("consumer: 5"), "queues[0].consumer", "must be a mapping"},
		{"list expected", queueDoc("bindings: k"), "queues[0].bindings", "must be a list"},
		{"management_url", "broker: {management_url: 'ftp://x'}\n" + queueDoc(""), "broker.management_url", "must be an http(s) URL"},
		// A '/' in the password cuts the host short: say what to do, quoting nothing.
		{"management_url password", "broker: {management_url: 'http://guest:a/b@127.0.0.1:15672'}\n" + queueDoc(""), "broker.management_url", "percent-encode any '#', '/', '?', '@', '%' or ':' in the user name or password"},
		// One API per node, comma separated: each is checked, by position.
		{"management_url list", "broker: {management_url: 'http://n1:15672, ftp://n2:15672'}\n" + queueDoc(""), "broker.management_url", "must be an http(s) URL such as http://127.0.0.1:15672 (several nodes'"},
		{"management_url list entry", "broker: {management_url: 'http://n1:15672,https://n2,'}\n" + queueDoc(""), "broker.management_url", "URL 3 of 3: must be an http(s) URL"},
		{"management_url hosts without schemes", "broker: {management_url: 'http://n1:15672,n2:15672'}\n" + queueDoc(""), "broker.management_url", "each with its scheme"},
		// docs/config.md: "at most 200 characters".
		{"name of 201 characters", "queues:\n  - name: " + strings.Repeat("q", 201) + "\n    exchange: {name: x}\n    accepts: [{type: a, versions: ['1']}]\n", "queues[0].name", "(at most 200)"},
		{"name starting with '_'", "queues:\n  - name: _q\n    exchange: {name: x}\n    accepts: [{type: a, versions: ['1']}]\n", "queues[0].name", "starting with a letter or digit"},
		{"max_body_bytes", "schemas: {max_body_bytes: -1}\n" + queueDoc(""), "schemas.max_body_bytes", "must be > 0"},
		{"no queues", "broker: {}\n", "queues", "at least one queue is required"},
		{"name required", "queues:\n  - exchange: {name: x}\n    accepts: [{type: a, versions: ['1']}]\n", "queues[0].name", "is required"},
		{"name chars", "queues:\n  - name: 'a b'\n    exchange: {name: x}\n    accepts: [{type: a, versions: ['1']}]\n", "queues[0].name", "use letters, digits"},
		{"name amq.", "queues:\n  - name: amq.x\n    exchange: {name: x}\n    accepts: [{type: a, versions: ['1']}]\n", "queues[0].name", `reserved by the broker`},
		{"exchange required", "queues:\n  - name: q\n    accepts: [{type: a, versions: ['1']}]\n", "queues[0].exchange.name", "is required"},
		{"exchange amq.", "queues:\n  - name: q\n    exchange: {name: amq.topic}\n    accepts: [{type: a, versions: ['1']}]\n", "queues[0].exchange.name", "is not a name dlxbridge can declare"},
		{"exchange type", "queues:\n  - name: q\n    exchange: {name: x, type: fan}\n    accepts: [{type: a, versions: ['1']}]\n", "queues[0].exchange.type", "must be direct, topic, fanout or headers"},
		{"bindings empty", queueDoc("bindings: []"), "queues[0].bindings", "at least one binding key"},
		{"delivery_limit", queueDoc("delivery_limit: -1"), "queues[0].delivery_limit", "must be >= 1"},
		{"max_length", queueDoc("max_length: -5"), "queues[0].max_length", "must be >= 0"},
		{"prefetch", queueDoc("consumer: {prefetch: 2001}"), "queues[0].consumer.prefetch", "must be in [1, 2000]"},
		{"concurrency", queueDoc("consumer: {concurrency: -1}"), "queues[0].consumer.concurrency", "must be >= 1"},
		{"handler_timeout", queueDoc("consumer: {handler_timeout: -1s}"), "queues[0].consumer.handler_timeout", "must be > 0"},
		{"crash_loop_deliveries low", queueDoc("consumer: {crash_loop_deliveries: -1}"), "queues[0].consumer.crash_loop_deliveries", "must be >= 1"},
		{"crash_loop_deliveries high", queueDoc("delivery_limit: 3\nconsumer: {crash_loop_deliveries: 4}"), "queues[0].consumer.crash_loop_deliveries", "must be <= delivery_limit (3)"},
		{"tiers empty", queueDoc("retry: {tiers: []}"), "queues[0].retry.tiers", "at least one delay"},
		{"tier zero", queueDoc("retry: {tiers: [0s]}"), "queues[0].retry.tiers[0]", "must be > 0"},
		{"tier sub-ms", queueDoc("retry: {tiers: [1500us]}"), "queues[0].retry.tiers[0]", "whole number of milliseconds"},
		{"tiers increasing", queueDoc("retry: {tiers: [5s, 1s]}"), "queues[0].retry.tiers[1]", "must be greater than the tier before it (5s)"},
		{"jitter", queueDoc("retry: {jitter: 1.5}"), "queues[0].retry.jitter", "must be in [0, 1]"},
		{"lanes", queueDoc("retry: {lanes: 17}"), "queues[0].retry.lanes", "must be in [1, 16]"},
		{"max_attempts", queueDoc("retry: {max_attempts: -2}"), "queues[0].retry.max_attempts", "must be in [1, 10000]"},
		// The config used to restate triage's rules and let these through;
		// consumer.New then refused the policy.
		{"max_attempts over triage's ceiling", queueDoc("retry: {max_attempts: 20000}"), "queues[0].retry.max_attempts", "must be in [1, 10000]"},
		{"NaN jitter", queueDoc("retry: {jitter: .nan}"), "queues[0].retry.jitter", "must be in [0, 1]"},
		{"max_elapsed", queueDoc("retry: {max_elapsed: -1m}"), "queues[0].retry.max_elapsed", "must be >= 0"},
		{"immediate_retries", queueDoc("retry: {immediate_retries: -1}"), "queues[0].retry.immediate_retries", "must be >= 0 (0 disables it)"},
		{"quarantine name", queueDoc("quarantine: {queue: 'amq.q'}"), "queues[0].quarantine.queue", "is not a name dlxbridge can declare"},
		{"retention", queueDoc("quarantine: {retention: -1h}"), "queues[0].quarantine.retention", "must be >= 0"},
		{"redact field", queueDoc("quarantine: {redact: {fields: [email]}}"), "queues[0].quarantine.redact.fields[0]", "is not a JSON pointer"},
		{"redact header", queueDoc("quarantine: {redact: {headers: ['']}}"), "queues[0].quarantine.redact.headers[0]", "must not be empty"},
		{"redact own header", queueDoc("quarantine: {redact: {headers: [authorization, DLXBridge-Redrive-Count]}}"), "queues[0].quarantine.redact.headers[1]", "one of the bridge's own headers"},
		{"message.from", queueDoc("message: {from: body}"), "queues[0].message.from", "must be properties, envelope or pointer"},
		{"type_pointer", queueDoc("message: {from: pointer, type_pointer: type}"), "queues[0].message.type_pointer", "is not a JSON pointer"},
		{"version_pointer", queueDoc("message: {from: pointer, version_pointer: v}"), "queues[0].message.version_pointer", "is not a JSON pointer"},
		{"accepts empty", "queues:\n  - name: q\n    exchange: {name: x}\n", "queues[0].accepts", "at least one message type"},
		{"accepts empty in report mode", "queues:\n  - name: q\n    exchange: {name: x}\n    gate: report\n", "queues[0].accepts", "at least one message type is required (or gate: off)"},
		{"gate", queueDoc("gate: warn"), "queues[0].gate", `must be enforce, report or off, not "warn"`},
		{"accept checked with gate off", "queues:\n  - name: q\n    exchange: {name: x}\n    gate: off\n    accepts: [{type: a}]\n", "queues[0].accepts[0].versions", "at least one version"},
		{"accept type", "queues:\n  - name: q\n    exchange: {name: x}\n    accepts: [{type: 'a b', versions: ['1']}]\n", "queues[0].accepts[0].type", "a type is letters"},
		{"accept twice", "queues:\n  - name: q\n    exchange: {name: x}\n    accepts: [{type: a, versions: ['1']}, {type: a, versions: ['2']}]\n", "queues[0].accepts[1].type", "is listed twice"},
		{"versions empty", "queues:\n  - name: q\n    exchange: {name: x}\n    accepts: [{type: a}]\n", "queues[0].accepts[0].versions", "at least one version"},
		{"version format", "queues:\n  - name: q\n    exchange: {name: x}\n    accepts: [{type: a, versions: ['1.2']}]\n", "queues[0].accepts[0].versions[0]", "a version is a whole number"},
		{"name collision", queueDoc("") + "  - name: orders.retry\n    exchange: {name: x}\n    accepts: [{type: a, versions: ['1']}]\n", "queues[1].name", `"orders.retry" is also used by queues[0].name`},
		// The collision from the hardening issue: b's quarantine was named
		// like one of a's retry lanes, validation let it through, and the
		// lane (which dead-letters into a after its TTL) took b's dead
		// letters.
		{"quarantine named like another queue's retry lane", twoQueues("", "quarantine: {queue: a.retry.1s.l0}"),
			"queues[1].quarantine.queue", `"a.retry.1s.l0" is also used by queues[0].retry.tiers[0] (retry lane 0 of 1s)`},
		{"work queue named like another queue's retry lane", twoQueues("retry: {tiers: [2s], jitter: 0}", "") + entry("a.retry.2s.l0", ""),
			"queues[2].name", `"a.retry.2s.l0" is also used by queues[0].retry.tiers[0] (retry lane 0 of 2s)`},
		{"retry lane named like another queue's quarantine", twoQueues("quarantine: {queue: b.retry.5s.l3}", ""),
			"queues[1].retry.tiers[1]", `its retry lane "b.retry.5s.l3" is also used by queues[0].quarantine.queue (quarantine)`},
		{"work exchange is another queue's dead-letter exchange", twoQueues("", "exchange: {name: a.dead}"),
			"queues[1].exchange.name", `"a.dead" is also used by queues[0].name (fanout dead-letter exchange)`},
		{"shared work exchange with two types", twoQueues("exchange: {name: x, type: topic}", "exchange: {name: x, type: direct}"),
			"queues[1].exchange.name", `"x" is also used by queues[0].exchange.name (topic work exchange)`},
		{"binding key twice", queueDoc("bindings: [k, k]"), "queues[0].bindings[1]", `"k" is listed twice`},
		{"quarantine collides with a work queue", queueDoc("") + "  - name: b\n    exchange: {name: x}\n    quarantine: {queue: orders}\n    accepts: [{type: a, versions: ['1']}]\n", "queues[1].quarantine.queue", `"orders" is also used by queues[0].name`},
		{"signing_key_env", "security: {signing_key_env: 'not-a-name'}\n" + queueDoc(""), "security.signing_key_env", "is not an environment variable name"},
		{"signing_key_env is not the key", "security: {signing_key_env: '0123456789abcdef 0123'}\n" + queueDoc(""), "security.signing_key_env", "the key itself never goes in this file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse([]byte(tt.doc))
			es, ok := config.AsErrors(err)
			if !ok {
				t.Fatalf("got %v, want field errors", err)
			}
			for _, e := range es {
				if e.Path == tt.path && strings.Contains(e.Msg, tt.msg) {
					return
				}
			}
			t.Fatalf("no error %s: ...%s...; got:\n%v", tt.path, tt.msg, err)
		})
	}
}

// With the gate off a queue needs no accepts; the other modes keep them
// (ones given with the gate off stay, so switching modes is a one-key change).
func TestGateModes(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{
		"queues:\n  - name: q\n    exchange: {name: x}\n    gate: off\n",
		queueDoc("gate: off"),
		queueDoc("gate: report"),
		queueDoc("gate: enforce"),
	} {
		cfg, err := config.Parse([]byte(doc))
		if err != nil {
			t.Errorf("%q: %v", doc, err)
			continue
		}
		if g := cfg.Queues[0].Gate; g == "" {
			t.Errorf("%q: gate left empty", doc)
		}
	}
}

func TestUnknownKeyMessage(t *testing.T) {
	t.Parallel()
	_, err := config.Parse([]byte(queueDoc("retry: {tierz: [1s]}")))
	if got, want := err.Error(), `queues[0].retry.tierz: unknown key (did you mean "tiers"?)`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestEveryProblemIsReportedAtOnce(t *testing.T) {
	t.Parallel()
	_, err := config.Parse([]byte(queueDoc("delivery_limit: -1\nretry: {lanes: 0, jitter: 2}\nconsumer: {prefetch: 9999}")))
	es, ok := config.AsErrors(err)
	if !ok || len(es) < 3 {
		t.Fatalf("got %v, want at least 3 problems", err)
	}
	// Unknown keys are reported together too.
	_, err = config.Parse([]byte(queueDoc("retyr: {}\nconsumr: {}")))
	if es, ok := config.AsErrors(err); !ok || len(es) != 2 {
		t.Fatalf("got %v, want 2 unknown keys", err)
	}
	// And in the same run as the values that are wrong, not in the next.
	_, err = config.Parse([]byte(queueDoc("retyr: {}\ndelivery_limit: -1")))
	es, ok = config.AsErrors(err)
	if !ok || len(es) != 2 || !strings.Contains(err.Error(), "retyr: unknown key") || !strings.Contains(err.Error(), "delivery_limit") {
		t.Fatalf("got %v, want the unknown key and the bad delivery_limit", err)
	}
}

func TestBadDocuments(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]string{
		"":          "config is empty",
		"queues: [": "not valid YAML",
		"queues:\n  - name: q\n    delivery_limit: lots\n    exchange: {name: x}\n    accepts: [{type: a, versions: ['1']}]\n": "wrong type",
		queueDoc("") + "---\nqueues: []\n": "line 6: a second YAML document",
		queueDoc("") + "---\nqueues: [\n":  "not valid YAML",
	} {
		_, err := config.Parse([]byte(doc))
		if err == nil {
			t.Errorf("%q: no error", doc)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", doc, err, want)
		}
	}
}

func TestShippedConfigLoads(t *testing.T) {
	t.Parallel()
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "config.yaml")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("shipped config.yaml: %v", err)
	}
	if len(cfg.Queues) < 2 {
		t.Fatalf("shipped config has %d queues, want a realistic example with several", len(cfg.Queues))
	}
	for _, q := range cfg.Queues {
		if q.Quarantine.Queue == "" || len(q.Retry.Tiers) == 0 || q.DeliveryLimit < 1 {
			t.Errorf("queue %s not fully defaulted: %+v", q.Name, q)
		}
	}
	if _, err := config.Load(filepath.Join(t.TempDir(), "absent.yaml")); !os.IsNotExist(err) {
		t.Errorf("missing file: got %v, want a not-exist error", err)
	}
}

// "0 = no time budget", as the docs say, written as a bare 0: YAML reads an
// integer, yet it is a duration to the config. Another bare number is still
// refused with the field's path.
func TestBareZeroIsADuration(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(queueDoc("retry: {max_elapsed: 0, tiers: [1s]}\nconsumer: {handler_timeout: 0s}")))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Queues[0].Retry.MaxElapsedValue(); got != 0 {
		t.Errorf("max_elapsed: 0 gave %s, want no budget", got)
	}
	_, err = config.Parse([]byte(queueDoc("retry: {max_elapsed: 5}")))
	if err == nil || !strings.Contains(err.Error(), `queues[0].retry.max_elapsed: "5" is not a duration`) {
		t.Errorf("max_elapsed: 5 gave %v", err)
	}
}

// A written 0 where the default replaces a Go zero would be read as "no
// retries", "no prefetch limit" or "no delivery limit": refused, with the field's path. Left
// out, the default applies.
func TestWrittenZeroIsRefusedWhereItWouldMislead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ extra, path string }{
		{"retry: {max_attempts: 0}", "queues[0].retry.max_attempts: 0 is not allowed"},
		{"consumer: {prefetch: 0}", "queues[0].consumer.prefetch: 0 is not allowed"},
		{"consumer: {concurrency: 00}", "queues[0].consumer.concurrency: 0 is not allowed"},
		{"delivery_limit: 0", "queues[0].delivery_limit: 0 is not allowed"},
		{"consumer: {crash_loop_deliveries: 0}", "queues[0].consumer.crash_loop_deliveries: 0 is not allowed"},
	} {
		_, err := config.Parse([]byte(queueDoc(c.extra)))
		if err == nil || !strings.Contains(err.Error(), c.path) {
			t.Errorf("%s: got %v, want %q", c.extra, err, c.path)
		}
	}
	cfg, err := config.Parse([]byte(queueDoc("retry: {max_attempts: 1}\nmax_length: 0")))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Queues[0].Retry.MaxAttempts != 1 {
		t.Errorf("max_attempts: 1 gave %d", cfg.Queues[0].Retry.MaxAttempts)
	}
}

// immediate_retries reaches the queue's retry policy as written.
func TestImmediateRetriesReachThePolicy(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(queueDoc("retry: {immediate_retries: 2, max_attempts: 5}")))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Queues[0].Policy(); p.ImmediateRetries != 2 || p.MaxAttempts != 5 {
		t.Errorf("policy %+v, want 2 immediate retries of 5 attempts", p)
	}
}

// The management APIs of several nodes, comma separated, load as given.
func TestManagementURLListLoads(t *testing.T) {
	t.Parallel()
	const list = "http://n1:15672, https://u:p%40ss@n2:15671/api-root"
	cfg, err := config.Parse([]byte("broker: {management_url: '" + list + "'}\n" + queueDoc("")))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Broker.ManagementURL != list {
		t.Errorf("management_url %q, want %q", cfg.Broker.ManagementURL, list)
	}
}
