package quarantine

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/wire"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/triage"
)

// FuzzEnvelopeRoundTrip: for any field values, Apply writes headers that
// amqp091-go accepts, and Read gives back the same envelope, except for
// what Apply documents it changes: texts cut to their Max*Bytes, lists
// keeping what fits, strings inside JSON made valid UTF-8, times in UTC.
//
// plain holds the fields copied as they are, separated by "\x1f"; lists
// holds validation errors ("pointer\x1fkeyword\x1fmessage" each), then the
// redacted and notes lists, separated by "\x1d", their entries by "\x1e".
func FuzzEnvelopeRoundTrip(f *testing.F) {
	at := time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)
	f.Add("bridge\x1fschema\x1fabc123\x1forders\x1forder.created\x1forders\x1fm-1\x1forders.created\x1f2\x1f00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\x1f4bf92f3577b34da6a3ce929d0e0e4736\x1fhost\x1fv1.2.3\x1f",
		"attempt budget exhausted (5/5)", "boom", "key-1", "goroutine 7 [running]:\nmain.handler()",
		int64(5), at.Unix(), int64(at.Nanosecond()), at.Unix()+1, int64(0), at.Unix()+2, int64(999999999),
		"/total\x1frequired\x1fmissing properties: 'total'\x1e/items/0\x1ftype\x1fexpected string\x1dheader:authorization\x1e/customer/email\x1ddlxbridge-attempts=-1 ignored")
	f.Add("", "", "", "", "", int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), "")
	f.Add("\xff\x1f\x1f\x1f", strings.Repeat("é", 3000), strings.Repeat("x", 5000), strings.Repeat("日", 200), strings.Repeat("s\n", 3000),
		int64(-1), int64(-62135596800), int64(0), int64(253402300799), int64(999999999), int64(-1), int64(-1),
		strings.Repeat("/a\x1fb\x1f"+strings.Repeat("m", 300)+"\x1e", 40)+"\x1d\xff\xfe\x1e<&>\x1d"+strings.Repeat("n\x1e", 1000))
	// Years RFC 3339 cannot write: a forged x-death time can be anything.
	f.Add("", "r", "", "", "", int64(1), int64(253402300800), int64(0), int64(-62167219201), int64(0), int64(1<<62), int64(0), "")
	f.Fuzz(func(t *testing.T, plain, reason, errText, key, stack string, attempts, s1, n1, s2, n2, s3, n3 int64, lists string) {
		fields := strings.Split(plain, "\x1f")
		field := func(i int) string {
			if i < len(fields) {
				return fields[i]
			}
			return ""
		}
		parts := strings.Split(lists, "\x1d")
		list := func(i int) []string {
			if i >= len(parts) || parts[i] == "" {
				return nil
			}
			return strings.Split(parts[i], "\x1e")
		}
		var vs []Violation
		for _, v := range list(0) {
			p := strings.SplitN(v, "\x1f", 3)
			for len(p) < 3 {
				p = append(p, "")
			}
			vs = append(vs, Violation{Pointer: p[0], Keyword: p[1], Message: p[2]})
		}
		in := Envelope{
			Source: field(0), Class: triage.Class(field(1)), Fingerprint: field(2),
			OriginalExchange: field(3), OriginalRouting: field(4), OriginalQueue: field(5),
			MessageID: field(6), MessageType: field(7), SchemaVersion: field(8),
			Traceparent: field(9), TraceID: field(10), WorkerHost: field(11), WorkerVersion: field(12),
			RedactionFailed: field(13),
			Reason:          reason, Error: errText, IdempotencyKey: key, Stack: stack,
			Attempts:       int(attempts),
			FirstFailureAt: fuzzTime(s1, n1), LastFailureAt: fuzzTime(s2, n2), QuarantinedAt: fuzzTime(s3, n3),
			Validation: vs, Redacted: list(1), Notes: list(2),
		}

		h := amqp.Table{}
		if in.Traceparent != "" {
			h["traceparent"] = in.Traceparent
		}
		in.Apply(h)
		if err := h.Validate(); err != nil {
			t.Fatalf("Apply wrote headers amqp091-go refuses: %v", err)
		}
		got, ok := Read(&amqp.Delivery{Headers: h, MessageId: in.MessageID})
		if !ok {
			t.Fatal("Read found no envelope")
		}

		want := in
		want.Reason = frame.Truncate(in.Reason, maxErrorBytes)
		want.Error = frame.Truncate(in.Error, maxErrorBytes)
		want.IdempotencyKey = frame.Truncate(in.IdempotencyKey, maxKeyBytes)
		want.Stack = frame.Truncate(in.Stack, MaxStackBytes)
		want.FirstFailureAt = recordedTime(in.FirstFailureAt)
		want.LastFailureAt = recordedTime(in.LastFailureAt)
		want.QuarantinedAt = recordedTime(in.QuarantinedAt)
		want.Validation = keptViolations(in.Validation)
		want.Redacted = keptStrings(in.Redacted, maxNotesBytes)
		want.Notes = keptStrings(in.Notes, maxNotesBytes)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, want)
		}
		// Signed, it reads back the same under the key, verified; with its
		// reason changed it does not.
		body := []byte(stack)
		signEnvelope(fuzzSigner, h, "q.dead", in.MessageID, body)
		signed, ok := ReadVerified(&amqp.Delivery{Headers: h, Exchange: "q.dead", MessageId: in.MessageID, Body: body}, fuzzSigner)
		want.Verified = true
		if !ok || !reflect.DeepEqual(signed, want) {
			t.Fatalf("signed round trip:\n got %#v\nwant %#v", signed, want)
		}
		forged := maps.Clone(h)
		forged[wire.HeaderReason] = "x" + frame.Truncate(in.Reason, maxErrorBytes)
		if env, _ := ReadVerified(&amqp.Delivery{Headers: forged, Exchange: "q.dead", MessageId: in.MessageID, Body: body}, fuzzSigner); env.Verified {
			t.Fatal("a changed reason verified")
		}
		for _, k := range []string{wire.HeaderFirstFailureAt, wire.HeaderLastFailureAt, wire.HeaderQuarantinedAt} {
			if s, ok := h[k].(string); ok {
				if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
					t.Errorf("%s: Apply wrote a time Read cannot parse: %v", k, err)
				}
			}
		}
		for k, limit := range map[string]int{wire.HeaderValidationErrors: maxValidationBytes, wire.HeaderRedacted: maxNotesBytes, wire.HeaderNotes: maxNotesBytes} {
			if s, _ := h[k].(string); len(s) > limit {
				t.Errorf("%s: %d bytes, over %d", k, len(s), limit)
			}
		}
	})
}

var fuzzSigner, _ = triage.NewSigner([]byte("the fuzz target's key, 32 bytes."))

func fuzzTime(sec, nsec int64) time.Time {
	if sec == 0 && nsec == 0 {
		return time.Time{}
	}
	return time.Unix(sec, nsec).UTC()
}

// recordedTime is what Read gives back for t: the same instant in UTC, or
// the zero time if RFC 3339 cannot write it (see Apply).
func recordedTime(t time.Time) time.Time {
	if t.IsZero() || t.Year() < 0 || t.Year() > 9999 {
		return time.Time{}
	}
	return t.UTC()
}

// asJSON is s after a trip through JSON: each byte that is not part of
// valid UTF-8 becomes U+FFFD.
func asJSON(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		b.WriteRune(r)
		i += n
	}
	return b.String()
}

// keptViolations: the longest prefix whose JSON fits maxValidationBytes,
// else one placeholder.
func keptViolations(vs []Violation) []Violation {
	if len(vs) == 0 {
		return nil
	}
	n := len(vs)
	for n > 0 && jsonLen(vs[:n]) > maxValidationBytes {
		n--
	}
	if n == 0 {
		return []Violation{{Message: fmt.Sprintf("%d violations; too large to record", len(vs))}}
	}
	out := make([]Violation, n)
	for i, v := range vs[:n] {
		out[i] = Violation{asJSON(v.Pointer), asJSON(v.Keyword), asJSON(v.Message)}
	}
	return out
}

// keptStrings: the longest suffix whose JSON fits limit, else a
// placeholder.
func keptStrings(ss []string, limit int) []string {
	if len(ss) == 0 {
		return nil
	}
	from := 0
	for from < len(ss) && jsonLen(ss[from:]) > limit {
		from++
	}
	if from == len(ss) {
		return []string{"too large to record"}
	}
	out := make([]string, 0, len(ss)-from)
	for _, s := range ss[from:] {
		out = append(out, asJSON(s))
	}
	return out
}

func jsonLen(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return len(b)
}
