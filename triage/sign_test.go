package triage

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/wire"
)

func TestSignerRoundTrip(t *testing.T) {
	t.Parallel()

	fields := []string{wire.HeaderAttempts, wire.HeaderFirstFailureAt, "dlxbridge-original-queue", "dlxbridge-notes"}
	h := table{
		wire.HeaderAttempts:        int64(3),
		wire.HeaderFirstFailureAt:  "2026-03-01T12:00:00Z",
		"dlxbridge-original-queue": "orders",
		"x-unrelated":              "not signed, may change",
	}
	h[wire.HeaderSignature] = testSigner.Sign(testSubject, h, fields)
	if v := testSigner.Verify(testSubject, h, fields); !v.Valid || v.Problem != "" {
		t.Fatalf("fresh signature: %+v", v)
	}
	if s := h[wire.HeaderSignature].(string); !strings.HasPrefix(s, "v1:") || len(s) != 3+43 {
		t.Fatalf("signature %q", s)
	}
	h["x-unrelated"] = "changed"
	if !testSigner.Verify(testSubject, h, fields).Valid {
		t.Fatal("an unsigned header broke the signature")
	}

	// The wire may hand values back in another representation of the same
	// value: any integer type, a byte array for a string.
	same := table{}
	for k, v := range h {
		same[k] = v
	}
	same[wire.HeaderAttempts] = int32(3)
	same["dlxbridge-original-queue"] = []byte("orders")
	if !testSigner.Verify(testSubject, same, fields).Valid {
		t.Fatal("the same values in other wire types did not verify")
	}

	changes := map[string]func(table){
		"attempts raised":         func(h table) { h[wire.HeaderAttempts] = int64(4) },
		"first failure moved":     func(h table) { h[wire.HeaderFirstFailureAt] = "2001-01-01T00:00:00Z" },
		"origin changed":          func(h table) { h["dlxbridge-original-queue"] = "billing" },
		"absent field added":      func(h table) { h["dlxbridge-notes"] = "" },
		"signed field removed":    func(h table) { delete(h, wire.HeaderFirstFailureAt) },
		"attempts as a string":    func(h table) { h[wire.HeaderAttempts] = "3" },
		"attempts as a float":     func(h table) { h[wire.HeaderAttempts] = 3.5 },
		"signature removed":       func(h table) { delete(h, wire.HeaderSignature) },
		"signature truncated":     func(h table) { h[wire.HeaderSignature] = h[wire.HeaderSignature].(string)[:20] },
		"signature of another ve": func(h table) { h[wire.HeaderSignature] = "v2:" + h[wire.HeaderSignature].(string)[3:] },
	}
	for name, change := range changes {
		c := table{}
		for k, v := range h {
			c[k] = v
		}
		change(c)
		if v := testSigner.Verify(testSubject, c, fields); v.Valid || v.Problem == "" {
			t.Errorf("%s: %+v", name, v)
		}
	}
	for name, sub := range map[string]Subject{
		"another queue":   {Queue: "billing", MessageID: testSubject.MessageID, Body: testSubject.Body},
		"another message": {Queue: workQueue, MessageID: "m-2", Body: testSubject.Body},
		"another body":    {Queue: workQueue, MessageID: testSubject.MessageID, Body: []byte(`{"id":2}`)},
	} {
		if testSigner.Verify(sub, h, fields).Valid {
			t.Errorf("the signature verified for %s", name)
		}
	}
	if mustSigner("another key, at least 16 bytes").Verify(testSubject, h, fields).Valid {
		t.Error("the signature verified under another key")
	}
	var none *Signer
	if v := none.Verify(testSubject, h, fields); v.Valid || none.Sign(testSubject, h, fields) != "" {
		t.Errorf("nil signer: %+v", v)
	}
}

// Field boundaries are part of the signature: moving bytes from one value
// into the next never yields the same input.
func TestSignerEncodingIsUnambiguous(t *testing.T) {
	t.Parallel()

	fields := []string{"a", "b"}
	h1 := table{"a": "xy", "b": "z"}
	h2 := table{"a": "x", "b": "yz"}
	h1[wire.HeaderSignature] = testSigner.Sign(testSubject, h1, fields)
	h2[wire.HeaderSignature] = h1[wire.HeaderSignature]
	if testSigner.Verify(testSubject, h2, fields).Valid {
		t.Fatal("values with moved boundaries share a signature")
	}
	s1 := testSigner.Sign(Subject{Queue: "ab", MessageID: "c"}, nil, nil)
	s2 := testSigner.Sign(Subject{Queue: "a", MessageID: "bc"}, nil, nil)
	if s1 == s2 {
		t.Fatal("subjects with moved boundaries share a signature")
	}
	empty := testSigner.Sign(testSubject, table{"a": ""}, []string{"a"})
	absent := testSigner.Sign(testSubject, table{}, []string{"a"})
	if empty == absent {
		t.Fatal("an empty header signs like an absent one")
	}
}

func TestNewSignerRefusesShortKeys(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"", "short", strings.Repeat("k", MinKeyBytes-1)} {
		if _, err := NewSigner([]byte(k)); err == nil {
			t.Errorf("NewSigner(%d bytes) accepted", len(k))
		}
	}
	key := []byte(strings.Repeat("k", MinKeyBytes))
	s, err := NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	sig := s.Sign(testSubject, nil, nil)
	key[0] = 'x' // the signer keeps its own copy
	if s.Sign(testSubject, nil, nil) != sig {
		t.Fatal("the signer shares the caller's key slice")
	}
}

func TestXDeathDigest(t *testing.T) {
	t.Parallel()

	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	up := table{"queue": "upstream", "reason": "rejected", "count": int64(1), "time": at, "exchange": "", "routing-keys": []any{"upstream"}}
	h := table{"x-death": []any{up}}
	d := XDeathDigest(h)
	if d == "" || d != XDeathDigest(table{"x-death": []any{table{"queue": "upstream", "reason": "rejected", "count": int32(1), "time": at, "exchange": "", "routing-keys": []any{[]byte("upstream")}}}}) {
		t.Fatalf("digest %q is not stable across wire types", d)
	}
	later := table{"queue": "upstream", "reason": "rejected", "count": int64(1), "time": at.Add(time.Second), "exchange": "", "routing-keys": []any{"upstream"}}
	again := table{"queue": "upstream", "reason": "rejected", "count": int64(2), "time": at, "exchange": "", "routing-keys": []any{"upstream"}}
	for name, other := range map[string]table{
		"dead-lettered again later":   {"x-death": []any{later}},
		"count raised":                {"x-death": []any{again}},
		"another hop in front":        {"x-death": []any{table{"queue": "mid", "reason": "expired", "count": int64(1)}, up}},
		"no history":                  {},
		"history that does not parse": {"x-death": "x"},
	} {
		if XDeathDigest(other) == d {
			t.Errorf("%s: same digest", name)
		}
	}
	if XDeathDigest(nil) != "" {
		t.Error("digest of nothing")
	}
}

// A placeholder keeps exactly a signature's room (Fit measures the headers
// with it in place) and never passes for one.
func TestSignerPlaceholder(t *testing.T) {
	t.Parallel()
	h := table{wire.HeaderAttempts: int64(1)}
	fields := []string{wire.HeaderAttempts}
	sig := testSigner.Sign(testSubject, h, fields)
	if p := testSigner.Placeholder(); len(p) != len(sig) {
		t.Errorf("placeholder %q is %d bytes, a signature %d", p, len(p), len(sig))
	}
	h[wire.HeaderSignature] = testSigner.Placeholder()
	if v := testSigner.Verify(testSubject, h, fields); v.Valid {
		t.Error("a placeholder verifies")
	}
	var none *Signer
	if none.Placeholder() != none.Sign(testSubject, h, fields) {
		t.Error("a nil Signer's placeholder differs from its signature")
	}
}

// The encoding a signature covers must not change between versions: a
// retry signed by the process before an upgrade is verified by the one
// after it. This vector was computed by the encoding as first released.
func TestSignerEncodingIsStable(t *testing.T) {
	t.Parallel()
	h := table{
		wire.HeaderAttempts:        int32(2),
		wire.HeaderFirstFailureAt:  "2026-03-01T12:00:00Z",
		"dlxbridge-original-queue": []byte("orders"),
		"dlxbridge-notes":          `["a","b"]`,
		"dlxbridge-odd":            1.5,
	}
	fields := []string{wire.HeaderAttempts, wire.HeaderFirstFailureAt, "dlxbridge-original-queue", "dlxbridge-notes", "dlxbridge-odd", "dlxbridge-absent"}
	const want = "v1:VBCnXDh6KoeZKO04jYVDFyxgu7bXofsJMbI71SIvjhc"
	if got := testSigner.Sign(testSubject, h, fields); got != want {
		t.Errorf("signature %q, want %q", got, want)
	}
}

// An envelope signature and a retry-state signature over the same headers
// differ (each has its own domain), and neither verifies as the other.
func TestSignEnvelopeHasItsOwnDomain(t *testing.T) {
	t.Parallel()
	fields := []string{wire.HeaderAttempts, "dlxbridge-class"}
	h := table{wire.HeaderAttempts: int64(2), "dlxbridge-class": "permanent"}
	env := testSigner.SignEnvelope(testSubject, h, fields)
	retry := testSigner.Sign(testSubject, h, fields)
	if env == retry || len(env) != len(retry) {
		t.Fatalf("envelope %q, retry %q", env, retry)
	}
	h[wire.HeaderEnvelopeSignature], h[wire.HeaderSignature] = env, retry
	if v := testSigner.VerifyEnvelope(testSubject, h, fields); !v.Valid {
		t.Fatalf("envelope: %+v", v)
	}
	h[wire.HeaderEnvelopeSignature], h[wire.HeaderSignature] = retry, env
	if testSigner.VerifyEnvelope(testSubject, h, fields).Valid || testSigner.Verify(testSubject, h, fields).Valid {
		t.Fatal("a signature verified in the other domain")
	}
	var none *Signer
	if none.SignEnvelope(testSubject, h, fields) != "" || none.VerifyEnvelope(testSubject, h, fields).Valid {
		t.Fatal("nil signer")
	}
}

// A signed header whose value is neither a string nor an integer (a table,
// an array, a float: never what the bridge writes) encodes only as its type
// name, so another value of the type would carry the same signature. Such a
// value never verifies.
func TestSignerNeverVerifiesValuesItCannotEncode(t *testing.T) {
	t.Parallel()
	fields := []string{wire.HeaderAttempts, "dlxbridge-notes"}
	for _, tc := range []struct {
		name          string
		signed, later any
	}{
		{"table swapped", table{"a": "x"}, table{"b": "y"}},
		{"table kept", table{"a": "x"}, table{"a": "x"}},
		{"array swapped", []any{"x"}, []any{"y", "z"}},
		{"float", 1.5, 2.5},
		{"bool", true, false},
	} {
		h := table{wire.HeaderAttempts: int64(2), "dlxbridge-notes": tc.signed}
		h[wire.HeaderSignature] = testSigner.Sign(testSubject, h, fields)
		h[wire.HeaderEnvelopeSignature] = testSigner.SignEnvelope(testSubject, h, fields)
		h["dlxbridge-notes"] = tc.later
		if v := testSigner.Verify(testSubject, h, fields); v.Valid || v.Problem == "" {
			t.Errorf("%s: retry signature %+v", tc.name, v)
		}
		if v := testSigner.VerifyEnvelope(testSubject, h, fields); v.Valid || v.Problem == "" {
			t.Errorf("%s: envelope signature %+v", tc.name, v)
		}
	}
}

// A redrive signature vouches for a replay's count on one message (id and
// body), under a domain of its own: a retry or envelope signature over the
// same count never verifies as one, and a changed count, body or message
// id fails.
func TestSignRedriveHasItsOwnDomain(t *testing.T) {
	t.Parallel()
	const count = wire.HeaderRedriveCount
	id, body := testSubject.MessageID, testSubject.Body
	h := table{count: int64(2)}
	h[wire.HeaderRedriveSignature] = testSigner.SignRedrive(id, body, h)
	if v := testSigner.VerifyRedrive(id, body, h); !v.Valid {
		t.Fatalf("fresh redrive signature: %+v", v)
	}
	// Not bound to a queue: a replay to another queue, or the broker
	// dead-lettering the replayed message, keeps it valid.
	if !testSigner.VerifyRedrive(id, append([]byte(nil), body...), table{count: int32(2), wire.HeaderRedriveSignature: h[wire.HeaderRedriveSignature]}).Valid {
		t.Fatal("the same count in another integer type did not verify")
	}
	fields := []string{count}
	sub := Subject{MessageID: id, Body: body}
	for name, sig := range map[string]string{
		"retry":    testSigner.Sign(sub, h, fields),
		"envelope": testSigner.SignEnvelope(sub, h, fields),
	} {
		c := table{count: int64(2), wire.HeaderRedriveSignature: sig}
		if v := testSigner.VerifyRedrive(id, body, c); v.Valid || !strings.Contains(v.Problem, "does not match") {
			t.Errorf("a %s signature verified as a redrive signature: %+v", name, v)
		}
	}
	// Nor the other way round.
	c := table{count: int64(2), wire.HeaderSignature: h[wire.HeaderRedriveSignature], wire.HeaderEnvelopeSignature: h[wire.HeaderRedriveSignature]}
	if testSigner.Verify(sub, c, fields).Valid || testSigner.VerifyEnvelope(sub, c, fields).Valid {
		t.Fatal("a redrive signature verified in another domain")
	}
	for name, tc := range map[string]struct {
		id   string
		body []byte
		h    table
	}{
		"count raised":      {id, body, table{count: int64(3)}},
		"count removed":     {id, body, table{}},
		"count as a string": {id, body, table{count: "2"}},
		"another body":      {id, []byte(`{"other":true}`), table{count: int64(2)}},
		"another id":        {"m-other", body, table{count: int64(2)}},
		"no signature":      {id, body, table{count: int64(2), wire.HeaderRedriveSignature: nil}},
	} {
		if _, ok := tc.h[wire.HeaderRedriveSignature]; !ok {
			tc.h[wire.HeaderRedriveSignature] = h[wire.HeaderRedriveSignature]
		} else {
			delete(tc.h, wire.HeaderRedriveSignature)
		}
		if v := testSigner.VerifyRedrive(tc.id, tc.body, tc.h); v.Valid || v.Problem == "" {
			t.Errorf("%s: verified: %+v", name, v)
		}
	}
	if other := mustSigner("fedcba9876543210fedcba9876543210"); other.VerifyRedrive(id, body, h).Valid {
		t.Fatal("another key verified")
	}
	var none *Signer
	if none.SignRedrive(id, body, h) != "" || none.VerifyRedrive(id, body, h).Valid {
		t.Fatal("nil signer")
	}
}

// A key of spaces or line breaks, or a short one padded with them, is no
// secret however long it is.
func TestNewSignerRefusesWhitespaceKeys(t *testing.T) {
	t.Parallel()
	for _, k := range []string{strings.Repeat(" ", 16), "\t\n\r \t\n\r \t\n\r \t\n\r ", "short\n\n\n\n\n\n\n\n\n\n\n\n"} {
		if _, err := NewSigner([]byte(k)); err == nil {
			t.Errorf("NewSigner(%q) accepted", k)
		}
	}
	if _, err := NewSigner([]byte("0123456789abcdef\n")); err != nil {
		t.Errorf("a 16-byte key with a trailing newline: %v", err)
	}
}

// An event signature vouches for one event body in one events stream,
// under a domain of its own: an envelope, retry or redrive signature made
// over the same stream name and body (a producer can get the runtime to
// sign an envelope over a body it chose) never verifies as an event's,
// nor does an event's in another stream or over another body.
func TestSignEventHasItsOwnDomain(t *testing.T) {
	t.Parallel()
	const stream = "orders.quarantine.events"
	body := []byte(`{"kind":"purged","by":"alice@ops-host","run":"r1","ids":["0123456789ab"]}`)
	sig := testSigner.SignEvent(stream, body)
	if v := testSigner.VerifyEvent(stream, body, table{wire.HeaderEventSignature: sig}); !v.Valid {
		t.Fatalf("fresh event signature: %+v", v)
	}
	sub := Subject{Queue: stream, Body: body}
	for name, other := range map[string]string{
		"envelope":          testSigner.SignEnvelope(sub, table{}, nil),
		"retry":             testSigner.Sign(sub, table{}, nil),
		"redrive":           testSigner.SignRedrive("", body, table{}),
		"another stream":    testSigner.SignEvent("payments.quarantine.events", body),
		"another body":      testSigner.SignEvent(stream, []byte(strings.Replace(string(body), "alice", "mallory", 1))),
		"another key":       mustSigner("fedcba9876543210fedcba9876543210").SignEvent(stream, body),
		"the placeholder":   testSigner.Placeholder(),
		"a truncated value": sig[:len(sig)-1],
	} {
		v := testSigner.VerifyEvent(stream, body, table{wire.HeaderEventSignature: other})
		if v.Valid || v.Problem == "" {
			t.Errorf("a %s signature verified as the event's: %+v", name, v)
		}
	}
	if v := testSigner.VerifyEvent(stream, body, table{}); v.Valid || !strings.Contains(v.Problem, "no "+wire.HeaderEventSignature) {
		t.Errorf("no signature: %+v", v)
	}
	// Nor the other way round: the event's signature is no envelope's.
	h := table{wire.HeaderEnvelopeSignature: sig, wire.HeaderSignature: sig}
	if testSigner.VerifyEnvelope(sub, h, nil).Valid || testSigner.Verify(sub, h, nil).Valid {
		t.Fatal("an event signature verified in another domain")
	}
	var none *Signer
	if none.SignEvent(stream, body) != "" || none.VerifyEvent(stream, body, table{wire.HeaderEventSignature: sig}).Valid {
		t.Fatal("nil signer")
	}
}

// BenchmarkSignVerify is a retry's signature: made once on the way out
// (Sign) and checked once on the way back (Verify), for a 1 KB body and
// the retry state's headers.
func BenchmarkSignVerify(b *testing.B) {
	s, err := NewSigner([]byte("0123456789abcdef-bench"))
	if err != nil {
		b.Fatal(err)
	}
	sub := Subject{Queue: "orders", MessageID: "m-0000001", Body: bytes.Repeat([]byte("x"), 1024)}
	h := map[string]any{
		wire.HeaderAttempts:           int64(1),
		wire.HeaderFirstFailureAt:     "2026-01-02T03:04:05.123456789Z",
		wire.HeaderOriginalExchange:   "orders",
		wire.HeaderOriginalRoutingKey: "order.created",
		wire.HeaderOriginalQueue:      "orders",
	}
	fields := SignedHeaders()
	b.ReportAllocs()
	for b.Loop() {
		h[wire.HeaderSignature] = s.Sign(sub, h, fields)
		if v := s.Verify(sub, h, fields); !v.Valid {
			b.Fatal(v.Problem)
		}
	}
}
