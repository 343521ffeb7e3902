package triage

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/wire"
)

// retype rewrites a decoded JSON value into the types the wire and forgers
// produce: tables as a named map type, arrays as []any, numbers as one of
// the integer or float types chosen by mode.
func retype(v any, mode byte) any {
	switch x := v.(type) {
	case map[string]any:
		t := table{}
		for k, e := range x {
			t[k] = retype(e, mode)
		}
		return t
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = retype(e, mode+uint8(i))
		}
		return out
	case float64:
		switch mode % 8 {
		case 0:
			return int64(x)
		case 1:
			return int32(x)
		case 2:
			return uint64(x)
		case 3:
			return int8(x)
		case 4:
			return float32(x)
		case 5:
			return time.Unix(int64(x), 0)
		case 6:
			return myInt(x)
		}
		return x
	case json.Number:
		return x
	case string:
		if mode%3 == 0 {
			return []byte(x)
		}
	}
	return v
}

func FuzzParseXDeath(f *testing.F) {
	f.Add([]byte(`[{"queue":"orders.retry.5s.l2","reason":"expired","count":3,"time":1772366400,"exchange":"orders.retry","routing-keys":["orders.retry.5s.l2"]},{"queue":"orders.retry.1s.l0","reason":"expired","count":1}]`), byte(0))
	f.Add([]byte(`[{"queue":"orders.retry.5s.l2","reason":"expired","count":1}]`), byte(1))
	f.Add([]byte(`[{"queue":"orders","reason":"delivery_limit","count":-1e300}]`), byte(2))
	f.Add([]byte(`{"queue":"orders","reason":"maxlen","count":"x","time":"2026-01-01T00:00:00Z"}`), byte(3))
	f.Add([]byte(`["x", null, 1.5, [[]], {"queue": {"a": 1}}]`), byte(4))
	f.Add([]byte(`"x-death"`), byte(5))
	f.Add([]byte(`[{"queue":"orders.retry.1s.l0","reason":"expired","count":1e19}]`), byte(6))
	// Forged retry state: every header of the fuzzed message
	// carries the value, none signed.
	f.Add([]byte(`50`), byte(0))
	f.Add([]byte(`999999`), byte(1))
	f.Add([]byte(`"2001-01-01T00:00:00Z"`), byte(2))
	f.Add([]byte(`[{"queue":"orders","reason":"delivery_limit","count":3,"time":978307200}]`), byte(0))
	f.Add([]byte(`[{"queue":"orders.retry.1s.l0","reason":"expired","count":1000000000,"time":978307200}]`), byte(0))
	f.Add([]byte(`[{"queue":"upstream","reason":"rejected","count":1,"exchange":"","routing-keys":["upstream"]}]`), byte(1))

	f.Fuzz(func(t *testing.T, data []byte, mode byte) {
		dec := json.NewDecoder(bytes.NewReader(data))
		if mode&0x80 != 0 {
			dec.UseNumber()
		}
		var raw any
		if dec.Decode(&raw) != nil {
			raw = data // not JSON: parse the bytes themselves
		}
		for _, v := range []any{raw, retype(raw, mode)} {
			h := ParseXDeath(v)
			if len(h.Notes) > maxNotes+1 || len(h.Deaths) > maxEntries {
				t.Fatalf("%d notes, %d entries", len(h.Notes), len(h.Deaths))
			}
			for _, d := range h.Deaths {
				if d.Count < 0 || d.Count > maxCount || d.Queue == "" || d.Reason == "" {
					t.Fatalf("bad entry %+v", d)
				}
				if got, ok := h.Find(d.Queue, d.Reason); !ok || got.Queue != d.Queue || got.Reason != d.Reason {
					t.Fatalf("Find(%q, %q) = %+v, %v", d.Queue, d.Reason, got, ok)
				}
			}
			if c := h.CountWhere(nil); c < 0 {
				t.Fatalf("CountWhere = %d", c)
			}
			h.Earliest()

			headers := map[string]any{wire.HeaderXDeath: v, wire.HeaderAttempts: v, wire.HeaderFirstFailureAt: v, wire.HeaderDeliveryCount: v, wire.HeaderSignature: v, wire.HeaderReadmitted: v,
				wire.HeaderRedriveCount: v, wire.HeaderRedriveSignature: v}
			isRetry := func(q string) bool { return strings.Contains(q, "retry") }
			// Unsigned (or forged) values never count; signed ones are
			// still bounded.
			forged := CountAttempts(AttemptInput{Headers: headers, Signature: verify(headers), IsRetryQueue: isRetry, Now: t0})
			if forged.Failed != 0 || !forged.FirstFailure.IsZero() || forged.Signed {
				t.Fatalf("unsigned headers counted: %+v", forged)
			}
			sh := signed(testSigner, headers)
			sig := verify(sh)
			// Only strings and integers are encoded as values: a signature
			// over anything else would vouch for any value of its type.
			_, isString := wireval.String(v)
			_, isInt := wireval.Int(v)
			if encodable := isString || isInt == wireval.IntOK; sig.Valid != encodable {
				t.Fatalf("signature over a fuzzed %s: %+v", wireval.TypeName(v), sig)
			}
			a := CountAttempts(AttemptInput{Headers: sh, Signature: sig, IsRetryQueue: isRetry, Now: t0})
			if a.Failed < 0 || a.Failed > maxAttemptsCeiling || a.Failed != a.FromHeader {
				t.Fatalf("attempts %+v", a)
			}
			if !a.FirstFailure.IsZero() && (a.FirstFailure.Before(minSaneTime) || a.FirstFailure.After(t0.Add(maxClockSkew))) {
				t.Fatalf("FirstFailure %v", a.FirstFailure)
			}
			for _, in := range []DeliveryInput{
				{WorkQueue: "orders", Headers: headers},
				{WorkQueue: "orders", Headers: sh, Redelivered: true, CarriedCounts: true, Signed: true, IsRetryQueue: isRetry},
				{WorkQueue: "orders", Headers: headers, Redelivered: true, IsRetryQueue: isRetry},
			} {
				v := Precheck(withCrashLoop(defaultPolicy, 1), in)
				if !in.Redelivered && v.Action != ActionDeliver {
					t.Fatalf("a first delivery skipped its handler: %+v", v)
				}
			}
			if testSigner.VerifyRedrive(testSubject.MessageID, testSubject.Body, headers).Valid {
				t.Fatal("a fuzzed redrive signature verified")
			}
			XDeathDigest(headers)
			ClassifyDeadLetter(h, headers)
		}
	})
}

func FuzzDecide(f *testing.F) {
	f.Add(true, int64(time.Second), int64(5*time.Second), int64(30*time.Second), 4, 0.2, 5, int64(15*time.Minute), "transient", int64(0), 1, int64(time.Minute), int64(time.Minute), 0.5, 0, 0)
	f.Add(false, int64(0), int64(-1), int64(math.MaxInt64), 0, math.NaN(), -1, int64(-1), "panic", int64(-5), -3, int64(0), int64(0), 2.0, -1, -1)
	f.Add(true, int64(math.MaxInt64/2), int64(math.MaxInt64/2), int64(math.MaxInt64/2), 16, 1.0, maxAttemptsCeiling, int64(0), "timeout", int64(math.MaxInt64), math.MaxInt, int64(math.MinInt64), int64(math.MaxInt64), 0.999999, math.MaxInt, math.MinInt)
	f.Add(true, int64(time.Second), int64(5*time.Second), int64(30*time.Second), 4, 0.2, 5, int64(15*time.Minute), "transient", int64(0), 1, int64(time.Minute), int64(time.Minute), 0.5, 2, 1)
	f.Add(true, int64(time.Second), int64(5*time.Second), int64(30*time.Second), 4, 0.2, 5, int64(time.Minute), "panic", int64(0), 0, int64(0), int64(0), 0.5, 3, 0)

	f.Fuzz(func(t *testing.T, sane bool, d0, d1, d2 int64, lanes int, jitter float64, maxAttempts int,
		maxElapsed int64, class string, hint int64, failed int, sinceFirst, untilNow int64, u float64,
		immediateRetries, immediate int) {
		p := Policy{Lanes: lanes, Jitter: jitter, MaxAttempts: maxAttempts, MaxElapsed: time.Duration(maxElapsed), ImmediateRetries: immediateRetries}
		if sane { // mostly valid policies, to reach the retry paths
			var prev int64
			for _, d := range []int64{d0, d1, d2} {
				prev += 1 + int64(uint64(d)%uint64(time.Hour))
				p.Tiers = append(p.Tiers, time.Duration(prev))
			}
			p.Lanes = 1 + int(uint(lanes)%16)
			p.Jitter = math.Abs(math.Mod(jitter, 1))
			if math.IsNaN(p.Jitter) {
				p.Jitter = 0
			}
			p.MaxAttempts = 1 + int(uint(maxAttempts)%20)
			p.MaxElapsed = time.Duration(uint64(maxElapsed) % uint64(24*time.Hour))
			p.ImmediateRetries = int(uint(immediateRetries) % 4)
		} else {
			p.Tiers = []time.Duration{time.Duration(d0), time.Duration(d1), time.Duration(d2)}[:int(uint(lanes)%4)]
		}
		now := t0.Add(time.Duration(untilNow % int64(100*365*24*time.Hour)))
		fl := Failure{Class: Class(class), Hint: time.Duration(hint), Now: now, ImmediateRetries: immediate,
			Attempts: Attempts{Failed: failed, FirstFailure: now.Add(-time.Duration(sinceFirst))}}
		if sinceFirst == 0 {
			fl.Attempts.FirstFailure = time.Time{}
		}

		v := Decide(p, fl, fixedRand(u))

		attempt := min(max(failed, 0), maxAttemptsCeiling) + 1
		if v.Attempt != attempt || v.Class != fl.Class {
			t.Fatalf("Attempt %d Class %q, want %d %q", v.Attempt, v.Class, attempt, fl.Class)
		}
		switch v.Action {
		case ActionQuarantine:
			if v.Reason == "" {
				t.Fatal("quarantine without a reason")
			}
			return
		case ActionRetry, ActionRetryNow:
		default:
			t.Fatalf("Action %q", v.Action)
		}
		if p.Validate() != nil || !fl.Class.Retryable() || attempt >= p.MaxAttempts {
			t.Fatalf("%s: policy %v, class %q, attempt %d/%d", v.Action, p.Validate(), fl.Class, attempt, p.MaxAttempts)
		}
		first := fl.Attempts.FirstFailure
		if first.IsZero() {
			first = now
		}
		if v.Action == ActionRetryNow {
			// Never for a panic or a Retry-After, never past the immediate
			// retries or the time budget, never with a delay.
			if fl.Class == ClassPanic || fl.Hint > 0 || max(immediate, 0) >= p.ImmediateRetries {
				t.Fatalf("retried now: class %q, hint %s, immediate %d/%d", fl.Class, fl.Hint, immediate, p.ImmediateRetries)
			}
			if p.MaxElapsed > 0 && now.Sub(first) > p.MaxElapsed {
				t.Fatalf("retried now beyond the time budget")
			}
			if v.Tier != 0 || v.Lane != 0 || v.Delay != 0 {
				t.Fatalf("retried now with tier %d lane %d delay %s", v.Tier, v.Lane, v.Delay)
			}
			return
		}
		if p.ImmediateRetries > max(immediate, 0) && fl.Hint <= 0 && fl.Class != ClassPanic &&
			(p.MaxElapsed == 0 || now.Sub(first) <= p.MaxElapsed) {
			t.Fatalf("delayed although an immediate retry was left: %+v", v)
		}
		if v.Tier < 0 || v.Tier >= len(p.Tiers) || v.Lane < 0 || v.Lane >= p.Lanes {
			t.Fatalf("tier %d lane %d out of range", v.Tier, v.Lane)
		}
		d := p.Tiers[v.Tier]
		lo, hi := LaneBounds(d, p.Jitter, p.Lanes, v.Lane)
		if v.Delay < d || v.Delay < lo || v.Delay > hi || float64(v.Delay) > float64(d)*(1+p.Jitter)+1 {
			t.Fatalf("delay %s outside tier %s ×(1+%v), lane [%s, %s]", v.Delay, d, p.Jitter, lo, hi)
		}
		if fl.Hint > 0 && d < fl.Hint && v.Tier != len(p.Tiers)-1 {
			t.Fatalf("hint %s not rounded up: tier %s", fl.Hint, d)
		}
		if p.MaxElapsed > 0 {
			if addDur(now.Sub(first), v.Delay) > p.MaxElapsed {
				t.Fatalf("retry beyond the time budget")
			}
		}
	})
}

func FuzzNormalizeMessage(f *testing.F) {
	for _, s := range []string{
		"order 123e4567-e89b-12d3-a456-426614174000 failed: dial tcp 10.0.0.1:5672",
		`can't "quote \"x\"" 'y' ` + "`z`",
		"timeout 1h2m3.5s 0xdeadBEEF 12345678 deadbeefcafe",
		"\xff\xfe invalid utf8 \u0130 \u212a",
		strings.Repeat("abcdefabc ", 40),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := NormalizeMessage(s)
		if direct := normalize(s[:min(len(s), maxNormalizeInput)]); direct != n {
			t.Fatalf("remembered %q for %q, computed %q", n, s, direct)
		}
		if !utf8.ValidString(n) || len(n) > maxNormalizedLen || strings.ContainsAny(n, "0123456789") {
			t.Fatalf("NormalizeMessage(%q) = %q", s, n)
		}
		if n != strings.TrimSpace(n) || strings.Contains(n, "  ") {
			t.Fatalf("whitespace not collapsed: %q", n)
		}
		if len(n) < maxNormalizedLen/2 && len(s) <= maxNormalizeInput {
			if again := NormalizeMessage(n); again != n {
				t.Fatalf("not idempotent: %q → %q → %q", s, n, again)
			}
		}
		Fingerprint(ClassTransient, s, s, s)
	})
}

func BenchmarkNormalizeMessage(b *testing.B) {
	short := `order 123e4567-e89b-12d3-a456-426614174000 failed: dial tcp 10.0.0.12:5672: i/o timeout after 1.5s, key "k-1"`
	long := strings.Repeat(short+" ", maxNormalizeInput/len(short)+1)
	b.Run("short", func(b *testing.B) {
		for b.Loop() {
			NormalizeMessage(short)
		}
	})
	b.Run("1KiB", func(b *testing.B) {
		for b.Loop() {
			NormalizeMessage(long)
		}
	})
	// Without the cache: every text new.
	b.Run("short-uncached", func(b *testing.B) {
		for b.Loop() {
			normalize(short)
		}
	})
	b.Run("1KiB-uncached", func(b *testing.B) {
		for b.Loop() {
			normalize(long[:maxNormalizeInput])
		}
	})
}
