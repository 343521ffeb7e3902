package schemas

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

// asciiPattern takes the patterns it can (the registry's codes among them)
// and accepts exactly what the regexp accepts.
func TestASCIIPatternAgrees(t *testing.T) {
	takes := []string{
		`^[A-Z]{3}$`, `^[A-Z]{2}$`, `^[A-Z0-9][A-Z0-9-]{2,31}$`, `^\+[1-9][0-9]{6,14}$`,
		`^ab$`, `^a+$`, `^a*$`, `^[a-c]?$`, `^x[0-9]{2}y[a-f]*$`, `\A[a-z]{1,3}\z`, `^[A-Z0-9._%+-]+$`,
		`^(?i)[a-c]{2}$`, `^[^\x80-\x{10FFFF}]{2}$`, `^a{0}b$`, `^a{1}$`, `^\w+$`,
	}
	refuses := []string{
		`[A-Z]{3}`, `^[A-Z]{3}`, `[A-Z]{3}$`, `^-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,4})?$`, `^a+b$`,
		`^[^a]$`, `^.$`, `^é$`, `^(?i)ab$`, `^(?i)[a-z]$`, `^(?i)[k]{2}$`, `^(?:ab){2}$`, `^[a-z]{1,2}[0-9]$`, `^a|b$`, `^(ab)$`, `(?m)^a$`, `^a\b$`, `^a*b*$`,
	}
	for _, src := range refuses {
		if newASCIIPattern(regexp.MustCompile(src)) != nil {
			t.Errorf("%s: taken, want the regexp to decide", src)
		}
	}
	alphabet := []string{"a", "b", "c", "x", "y", "z", "A", "B", "Z", "0", "1", "9", "-", "+", ".", "_", "%", " ", "\n", "é", "\xff", "\x80", "\x00", "ß"}
	rng := rand.New(rand.NewPCG(11, 11))
	for _, src := range takes {
		re := regexp.MustCompile(src)
		p := newASCIIPattern(re)
		if p == nil {
			t.Errorf("%s: not taken", src)
			continue
		}
		check := func(s string) {
			if got, want := p.match(s), re.MatchString(s); got != want {
				t.Errorf("%s on %q: %v, the regexp says %v", src, s, got, want)
			}
		}
		for _, s := range []string{"", "USD", "EUR\n", "usd", "US", "USDX", "SKU-0001", "PAD-0001", "+4915112345678", "+0123", "ab", "a", "aaa", "x12y", "x12yabc", "b"} {
			check(s)
		}
		for range 3000 {
			n := rng.IntN(18)
			var s string
			for range n {
				s += alphabet[rng.IntN(len(alphabet))]
			}
			check(s)
		}
	}
}

// FuzzASCIIPattern is the differential test over patterns as well as
// inputs: for any pattern the fast matcher takes, it must accept exactly
// what the regexp accepts (non-ASCII, invalid UTF-8, NUL, a trailing
// newline against $, case folding that reaches outside ASCII).
func FuzzASCIIPattern(f *testing.F) {
	for _, p := range []string{`^[A-Z]{3}$`, `^[A-Z0-9][A-Z0-9-]{2,31}$`, `^\+[1-9][0-9]{6,14}$`, `(?i)^[a-z]{2}$`,
		`^(?i)[k]$`, `^[\x00-\x7f]+$`, `^a{2,}$`, `^[a-c]{2}?$`, `\A\x00*\z`, `^(?:[0-9]){3}$`, `^\d\w\s$`, `^[[:alpha:]]+$`} {
		for _, s := range []string{"", "ABC", "abc\n", "K", "\u212a", "\xff", "\x00", "aa", "a1 ", "ſ"} {
			f.Add(p, s)
		}
	}
	f.Fuzz(func(t *testing.T, src, s string) {
		re, err := regexp.Compile(src)
		if err != nil {
			return
		}
		p := newASCIIPattern(re)
		if p == nil {
			return
		}
		if got, want := p.match(s), re.MatchString(s); got != want {
			t.Fatalf("%s on %q: %v, the regexp says %v", src, s, got, want)
		}
	})
}
