package schemas

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// costlySchema has a costly-but-allowed pattern on two properties (two
// patterns of one expression), under an anyOf (which the invalid path hands to jsonschema
// whole), and as a patternProperties key.
const costlySchema = `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
 "properties": {
  "name": {"type": "string", "pattern": "` + costlyPatternOK + `"},
  "alias": {"type": "string", "pattern": "` + costlyPatternOK + `"},
  "either": {"anyOf": [{"type": "string", "pattern": "` + costlyPatternOK + `"}, {"type": "integer"}]}
 },
 "patternProperties": {"^k` + costlyPatternOK + `$": {"type": "integer"}}}`

// checkRuns runs g on in with a run of its own and returns what the check
// said and how many costly matches it ran.
func checkRuns(g *Gate, ctx context.Context, in Input) (*Message, *ValidationError, error, int) {
	d := getTokDoc()
	defer d.release()
	d.run.start(ctx)
	m, verr := g.check(d, in)
	return m, verr, d.run.err, d.run.runs
}

// The gate runs a costly pattern once per value, whichever of its paths
// (tokens, tree, the invalid path, jsonschema) look at the value, and its
// violations read as jsonschema's.
func TestGateRunsACostlyPatternOncePerValue(t *testing.T) {
	t.Parallel()
	reg, err := loadOne(t, costlySchema)
	if err != nil {
		t.Fatal(err)
	}
	if reg.fast[reg.schemas["t\x00"+"1"]] == nil {
		t.Fatal("the schema has no fast path")
	}
	props, err := NewGate(GateConfig{Registry: reg, MaxBodyBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	env, err := NewGate(GateConfig{Registry: reg, MaxBodyBytes: -1, Identity: Identity{From: FromEnvelope}})
	if err != nil {
		t.Fatal(err)
	}
	full := map[*Gate]*Gate{}
	for _, g := range []*Gate{props, env} {
		f, err := NewGate(GateConfig{Registry: reg, MaxBodyBytes: -1, Identity: g.id})
		if err != nil {
			t.Fatal(err)
		}
		f.fullValidate, f.noStream = true, true
		full[g] = f
	}

	bad := func(n int) string { return strings.Repeat("a", n) } // no x: fails after a costly match
	good := func(n int) string { return strings.Repeat("a", n-1) + "x" }
	in := func(g *Gate, body string) Input {
		if g == env {
			return Input{Body: []byte(`{"type":"t","schemaVersion":"1","data":` + body + `}`)}
		}
		return Input{Type: "t", Headers: map[string]any{"schema-version": "1"}, Body: []byte(body)}
	}
	cases := []struct {
		name    string
		gate    *Gate
		body    string
		runs    int
		valid   bool
		compare bool // with the full validation (slow: it runs the pattern with the regexp package)
		msgs    []string
	}{
		{name: "small body, tokens", gate: props, body: `{"name":"` + bad(8<<10) + `"}`, runs: 1, compare: true},
		{name: "large body, tree", gate: props, body: `{"name":"` + bad(40<<10) + `"}`, runs: 1,
			msgs: []string{"/name pattern: does not match pattern '" + costlyPatternOK + "'"}},
		{name: "envelope", gate: env, body: `{"name":"` + bad(8<<10) + `"}`, runs: 1, compare: true},
		{name: "one value twice", gate: props, body: `{"name":"` + bad(8<<10) + `","alias":"` + bad(8<<10) + `"}`, runs: 1, compare: true},
		{name: "two values", gate: props, body: `{"name":"` + bad(8<<10) + `","alias":"` + bad(9<<10) + `"}`, runs: 2, compare: true},
		{name: "valid", gate: props, body: `{"name":"` + good(8<<10) + `"}`, runs: 1, valid: true},
		{name: "valid, large", gate: props, body: `{"name":"` + good(40<<10) + `"}`, runs: 1, valid: true},
		{name: "under anyOf", gate: props, body: `{"either":"` + bad(8<<10) + `"}`, runs: 1,
			msgs: []string{"/either schema: " + notListed}},
		{name: "a member's name", gate: props, body: `{"k` + good(800) + `":"one"}`, runs: 1, compare: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, verr, stop, runs := checkRuns(tc.gate, context.Background(), in(tc.gate, tc.body))
			if stop != nil {
				t.Fatal(stop)
			}
			if runs != tc.runs {
				t.Errorf("%d costly matches, want %d", runs, tc.runs)
			}
			if tc.valid {
				if m == nil || verr != nil {
					t.Fatalf("valid message: %v", verr)
				}
				return
			}
			if verr == nil {
				t.Fatal("invalid message passed")
			}
			var got []string
			for _, v := range verr.Violations {
				got = append(got, v.String())
			}
			if tc.msgs != nil && fmt.Sprint(got) != fmt.Sprint(tc.msgs) {
				t.Errorf("violations %q, want %q", got, tc.msgs)
			}
			if tc.compare {
				_, want, _, _ := checkRuns(full[tc.gate], context.Background(), in(tc.gate, tc.body))
				if !sameViolations(verr, want) {
					t.Errorf("violations:\n%s\nfull validation:\n%s", mustJSON(verr), mustJSON(want))
				}
			}
		})
	}
}

// deadlineOnly has a deadline and no timer: its Done never closes, as a
// consumer's per-delivery gate context (the gate compares the time).
type deadlineOnly struct {
	context.Context
	at time.Time
}

func (c deadlineOnly) Deadline() (time.Time, bool) { return c.at, true }

// A check of a costly-but-allowed pattern on a 256 KiB string, which takes
// seconds, stops soon after a short deadline, with an error that says so
// and is no *ValidationError, whether the context's Done closes or not, and
// for a schema without a fast path too (whose jsonschema validation goes
// on in the background).
func TestCheckContextStopsAtTheDeadline(t *testing.T) {
	t.Parallel()
	reg, err := loadOne(t, costlySchema)
	if err != nil {
		t.Fatal(err)
	}
	noFast, err := loadOne(t, `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
		"properties": {"name": {"type": "string", "pattern": "`+costlyPatternOK+`"}}, "unevaluatedProperties": false}`)
	if err != nil {
		t.Fatal(err)
	}
	if s := noFast.schemas["t\x001"]; noFast.fast[s] != nil {
		t.Fatal("the unevaluatedProperties schema has a fast path")
	}
	for _, tc := range []struct {
		name string
		reg  *Registry
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"timeout", reg, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}},
		{"deadline without a timer", reg, func() (context.Context, context.CancelFunc) {
			return deadlineOnly{context.Background(), time.Now().Add(100 * time.Millisecond)}, func() {}
		}},
		{"cancelled", reg, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			return ctx, cancel
		}},
		{"no fast path", noFast, func() (context.Context, context.CancelFunc) {
			return deadlineOnly{context.Background(), time.Now().Add(100 * time.Millisecond)}, func() {}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, err := NewGate(GateConfig{Registry: tc.reg, MaxBodyBytes: -1})
			if err != nil {
				t.Fatal(err)
			}
			n := 256 << 10
			if tc.reg == noFast {
				// It goes on after the check returns: seconds, not tens.
				n = 16 << 10
				defer unstoppable.Wait()
			}
			body := []byte(`{"name":"` + strings.Repeat("a", n) + `"}`)
			ctx, cancel := tc.ctx()
			defer cancel()
			begin := time.Now()
			m, err := g.CheckContext(ctx, Input{Type: "t", Headers: map[string]any{"schema-version": "1"}, Body: body})
			took := time.Since(begin)
			var verr *ValidationError
			if m != nil || !errors.Is(err, ErrStopped) || errors.As(err, &verr) {
				t.Fatalf("got %v, %v; want ErrStopped and no message", m, err)
			}
			if want := context.DeadlineExceeded; tc.name == "cancelled" {
				if !errors.Is(err, context.Canceled) {
					t.Errorf("%v does not say it was cancelled", err)
				}
			} else if !errors.Is(err, want) {
				t.Errorf("%v does not say the deadline passed", err)
			}
			// Generous on a loaded machine: the match alone takes seconds.
			if took > 3*time.Second {
				t.Errorf("returned after %s with a 100ms deadline", took)
			}
		})
	}
}
