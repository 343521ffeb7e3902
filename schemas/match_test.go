package schemas

import (
	"context"
	"errors"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The gate's machine answers as the regexp package does, on patterns and
// strings made to reach every kind of instruction: anchors, word
// boundaries, flags, classes, counted repetitions, alternatives, invalid
// UTF-8.
func TestPatternMachineAgreesWithRegexp(t *testing.T) {
	t.Parallel()
	fixed := []string{``, `^`, `$`, `^$`, `a`, `^a`, `a$`, `^a$`, `\Aab\z`, `(?m)^b$`, `(?s)a.b`, `a.b`, `\bfoo\b`, `\Bo`, `(?i)ÄbC`,
		`[^a-c]+`, `x*`, `x+?y`, `(a|b)*c`, `[a-z]{2,5}[0-9]?$`, `^[A-Z0-9][A-Z0-9-]{2,31}$`, `\p{Greek}+`, `[\x{1F600}-\x{1F64F}]`,
		`^(\d{3}-)?\d{4}$`, `(?:^|,)x(?:,|$)`, `a{0}b`, `[[:alpha:]]+`, `\pL\PL`, `(?U)a+`, `.`, `(?s).`, `\n`, `[^\n]`, `^\s*$`,
		`[a-z]{0,50}x`, `^(a|ab)(c|bcd)(d*)$`, `\x{FFFD}`}
	rng := rand.New(rand.NewPCG(1, 2))
	atoms := []string{"a", "b", "x", ".", "[a-c]", "[^b]", `\d`, `\w`, `\s`, `\b`, `\B`, "^", "$", "é", `\x{FFFD}`, "(?i:A)", "(?m:^)", "(?m:$)"}
	var gen func(depth int) string
	gen = func(depth int) string {
		if depth > 3 {
			return atoms[rng.IntN(len(atoms))]
		}
		switch rng.IntN(7) {
		case 0:
			return gen(depth+1) + gen(depth+1)
		case 1:
			return "(" + gen(depth+1) + "|" + gen(depth+1) + ")"
		case 2:
			return "(?:" + gen(depth+1) + ")*"
		case 3:
			return "(?:" + gen(depth+1) + "){1,3}"
		case 4:
			return "(?:" + gen(depth+1) + ")?"
		default:
			return atoms[rng.IntN(len(atoms))]
		}
	}
	patterns := append([]string(nil), fixed...)
	for range 400 {
		patterns = append(patterns, gen(0))
	}
	letters := []string{"a", "b", "c", "x", "1", " ", "\n", "é", "Ä", "ä", "\xff", "\xe2\x82", "😀", "-", "Z"}
	strs := []string{"", "a", "ab", "abc", "foo", "a foo b", "aaaaaaaaaaab", "\xff", "x\ny", "ÄBC", "äbc"}
	for range 60 {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(letters[rng.IntN(len(letters))])
		}
		strs = append(strs, b.String())
	}
	for _, expr := range patterns {
		re, err := regexp.Compile(expr)
		if err != nil {
			continue
		}
		p := newPattern(re)
		if p.prog == nil {
			t.Fatalf("%q: no program", expr)
		}
		for _, s := range strs {
			got, stopped := p.match(s, func() bool { return false })
			if want := re.MatchString(s); got != want || stopped {
				t.Errorf("pattern %q on %q: machine %v (stopped %v), regexp %v", expr, s, got, stopped, want)
			}
		}
	}
}

// costlyPatternOK is under MaxPatternInsts, and costs its size on every
// byte of a long string of letters without an "x": seconds for 256 KiB.
const costlyPatternOK = `[a-z]{0,900}x`

// A costly match runs once per pattern and value in a check, and stops
// soon after the check's context ends.
func TestCostlyMatchRunsOnceAndStops(t *testing.T) {
	t.Parallel()
	p := newPattern(regexp.MustCompile(costlyPatternOK))
	if p.insts > MaxPatternInsts {
		t.Fatalf("the pattern has %d instructions, over the bound", p.insts)
	}
	long := strings.Repeat("a", 256<<10)
	if !p.costly(len(long)) || p.costly(10) {
		t.Fatalf("costly(%d) %v, costly(10) %v", len(long), p.costly(len(long)), p.costly(10))
	}
	// Once: the second ask of the same value is the memo's.
	var r run
	r.start(context.Background())
	short := strings.Repeat("b", 200) + "x"
	if !r.match(p, short) || len(r.memo) != 1 {
		t.Fatalf("first match: memo %d", len(r.memo))
	}
	r.memo[memoKey{p.re.String(), short}] = false // what a second run would not say
	if r.match(p, short) {
		t.Error("the second match ran the pattern again")
	}

	// Stops: a match that would take seconds returns within a fraction of
	// the deadline past it, with the context's error.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var r2 run
	r2.start(ctx)
	begin := time.Now()
	if r2.match(p, long) {
		t.Error("a stopped match said yes")
	}
	took := time.Since(begin)
	if !errors.Is(r2.err, ErrStopped) || !errors.Is(r2.err, context.DeadlineExceeded) {
		t.Errorf("after the deadline: err %v", r2.err)
	}
	if took > 2*time.Second {
		t.Errorf("the match took %s with a 50ms deadline", took)
	}
	if len(r2.memo) != 0 {
		t.Error("a stopped match left a verdict")
	}
}
