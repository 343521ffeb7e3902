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
