package schemas

import (
	"math/rand"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// TestPlainEmailIsValidEmail: whatever plainEmail accepts, jsonschema's own
// email check accepts too (so the fast path never lets through what the
// slow one would refuse), on hand-picked and random strings.
func TestPlainEmailIsValidEmail(t *testing.T) {
	t.Parallel()
	slow := jsonschema.Formats["email"]
	cases := []string{
		"jane.doe@example.com", "a@b", "a@b.io", "a+tag@x-y.example", "a_b%c@1.2.3.4", "A.B-C@EXAMPLE.COM",
		"", "@", "a@", "@b", ".a@b", "a.@b", "a..b@c", "a@b.", "a@.b", "a@b..c", "a@-b", "a@b-", "a@b-.c", "a@b.-c",
		"a@b@c", "a b@c", "\"a\"@b", "a@[127.0.0.1]", "a@b_c", strings.Repeat("a", 64) + "@b", strings.Repeat("a", 65) + "@b",
		"a@" + strings.Repeat("b", 63), "a@" + strings.Repeat("b", 64), "a@" + strings.Repeat("b.", 126) + "c", "é@b",
	}
	want := map[string]bool{"jane.doe@example.com": true, "a@b": true, "a@b.io": true, "a+tag@x-y.example": true,
		"a_b%c@1.2.3.4": true, "A.B-C@EXAMPLE.COM": true, strings.Repeat("a", 64) + "@b": true, "a@" + strings.Repeat("b", 63): true}
	for _, s := range cases {
		if got := plainEmail(s); got != want[s] {
			t.Errorf("plainEmail(%q) = %v, want %v", s, got, want[s])
		}
	}
	rng := rand.New(rand.NewSource(1))
	const alphabet = "ab0Z.-_%+@..--!\"é[] "
	accepted := 0
	random := func(n int) string {
		b := make([]byte, n)
		for j := range b {
			if rng.Intn(10) == 0 {
				b[j] = alphabet[rng.Intn(len(alphabet))]
			} else {
				b[j] = "abZ09.-_%+"[rng.Intn(10)]
			}
		}
		return string(b)
	}
	for i := 0; i < 100000; i++ {
		cases = append(cases, random(1+rng.Intn(12)), random(rng.Intn(6))+"@"+random(rng.Intn(8)))
	}
	for _, s := range cases {
		if plainEmail(s) {
			accepted++
			if !slow(s) {
				t.Errorf("plainEmail accepts %q, jsonschema refuses it", s)
			}
		}
	}
	if accepted < 5000 {
		t.Errorf("only %d random addresses accepted: the test proves little", accepted)
	}
}

// TestPlainFormatsAreValid: whatever plainUUID and plainDateTime accept,
// jsonschema's own uuid and date-time checks accept too, on hand-picked
// strings and random ones near the shape; and they take the common forms.
func TestPlainFormatsAreValid(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewSource(2))
	mutate := func(s string) string {
		b := []byte(s)
		for range 1 + rng.Intn(3) {
			const alphabet = "0123456789-:TtZz.+ aFgé"
			switch i := rng.Intn(len(b) + 1); rng.Intn(3) {
			case 0:
				if i < len(b) {
					b[i] = alphabet[rng.Intn(len(alphabet))]
				}
			case 1:
				b = append(b[:i], append([]byte{alphabet[rng.Intn(len(alphabet))]}, b[i:]...)...)
			default:
				if i < len(b) {
					b = append(b[:i], b[i+1:]...)
				}
			}
		}
		return string(b)
	}
	for _, tc := range []struct {
		name  string
		plain func(string) bool
		takes []string
		seeds []string
	}{
		{"uuid", plainUUID,
			[]string{"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b", "00000000-0000-4000-8000-000000000007", "ABCDEF01-2345-6789-abcd-ef0123456789"},
			[]string{"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7", "5f1c9b4e8d3a-4f7e-9a1b-2c3d4e5f6a7b-", "5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7g", "{5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b}"}},
		{"date-time", plainDateTime,
			[]string{"2026-11-29T19:13:25.123Z", "2026-01-02T03:04:05Z", "2024-02-29T00:00:00Z", "2000-02-29T23:59:59.9Z", "0001-12-31T00:00:00Z"},
			[]string{"2026-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-13-01T00:00:00Z", "2026-00-01T00:00:00Z",
				"2026-01-00T00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01T23:60:00Z", "2026-01-01T23:59:60Z", "2016-12-31T23:59:60Z",
				"2026-01-01T00:00:00.Z", "2026-01-01T00:00:00z", "2026-01-01t00:00:00Z", "2026-01-01T00:00:00+01:00", "0000-01-01T00:00:00Z",
				"2026-01-01T00:00:00", "2026-1-01T00:00:00Z", "+026-01-01T00:00:00Z", "2026-01-01T00:00:00.1234567890Z"}},
	} {
		slow := jsonschema.Formats[tc.name]
		for _, s := range tc.takes {
			if !tc.plain(s) {
				t.Errorf("%s: %q not taken", tc.name, s)
			}
		}
		cases := append(append([]string{""}, tc.takes...), tc.seeds...)
		for range 100000 {
			cases = append(cases, mutate(cases[rng.Intn(len(tc.takes)+len(tc.seeds))+1]))
		}
		for _, s := range cases {
			if tc.plain(s) && !slow(s) {
				t.Errorf("%s: plain check accepts %q, jsonschema refuses it", tc.name, s)
			}
		}
	}
}

// FuzzPlainFormats: what a plain check accepts, jsonschema's own check of
// that format accepts.
func FuzzPlainFormats(f *testing.F) {
	for _, s := range []string{"5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b", "2026-11-29T19:13:25.123Z", "2024-02-29T00:00:00Z", "jane.doe@example.com", "2016-12-31T23:59:60Z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, plain := range plainFormats {
			if plain(s) && !jsonschema.Formats[name](s) {
				t.Fatalf("%s: plain check accepts %q, jsonschema refuses it", name, s)
			}
		}
	})
}

// TestReplacedFormatCheckerRules: a process that replaced jsonschema's own
// uuid, date-time or email checker in jsonschema.Formats (say, with a
// stricter one) has its checker decide, on the gate's fast path and the
// tree path alike, as it did before the plain checks existed: a plain
// check vouches only for jsonschema's own checker. Not parallel: it swaps
// a process-wide map, restored before any parallel test runs.
func TestReplacedFormatCheckerRules(t *testing.T) {
	for _, c := range []struct{ format, value string }{
		{"uuid", "5F1C9B4E-8D3A-4F7E-9A1B-2C3D4E5F6A7B"},
		{"date-time", "2026-11-29T19:13:25Z"},
		{"email", "jane.doe@example.com"},
	} {
		t.Run(c.format, func(t *testing.T) {
			own := jsonschema.Formats[c.format]
			jsonschema.Formats[c.format] = func(any) bool { return false } // refuses everything
			t.Cleanup(func() { jsonschema.Formats[c.format] = own })
			r, err := loadOne(t, `{"type":"object","properties":{"v":{"type":"string","format":"`+c.format+`"}}}`)
			if err != nil {
				t.Fatal(err)
			}
			body := []byte(`{"v":"` + c.value + `"}`)
			if err := r.Validate("t", "1", map[string]any{"v": c.value}); err == nil {
				t.Errorf("Validate takes %s %q, which the registered checker refuses", c.format, c.value)
			}
			g, err := NewGate(GateConfig{Registry: r})
			if err != nil {
				t.Fatal(err)
			}
			in := Input{ContentType: "application/json", Type: "t", Headers: map[string]any{"schema-version": "1"}, Body: body}
			if _, err := g.Check(in); err == nil {
				t.Errorf("the gate takes %s %q, which the registered checker refuses", c.format, c.value)
			}
		})
	}
	// Restored, the plain checks are back (and accept these).
	r, err := loadOne(t, `{"type":"string","format":"uuid"}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Validate("t", "1", "5F1C9B4E-8D3A-4F7E-9A1B-2C3D4E5F6A7B"); err != nil {
		t.Error(err)
	}
}

// TestOwnCheckersRecognised: left as jsonschema ships them, every format
// with a plain check gets registerFormats' checker (else the plain checks
// would silently never run).
func TestOwnCheckersRecognised(t *testing.T) {
	t.Parallel()
	c := jsonschema.NewCompiler()
	registerFormats(c)
	for name := range plainFormats {
		if c.Formats[name] == nil {
			t.Errorf("%s: jsonschema's own checker not recognised", name)
		}
	}
	if len(ownCheckers) != len(plainFormats) {
		t.Errorf("ownCheckers names %d formats, plainFormats %d", len(ownCheckers), len(plainFormats))
	}
}
