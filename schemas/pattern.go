package schemas

import (
	"fmt"
	"regexp"
	"regexp/syntax"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// MaxPatternInsts bounds the size of a pattern's compiled program. Go's
// regexp runs in time proportional to the string's length times the
// program's size, and a counted repetition grows the program by its count:
// fifty alternatives of [a-z]{0,1000} make a program of about 100,000
// instructions, seconds of CPU for each short string a producer sends. A
// pattern for codes and identifiers ([a-z0-9]{1,255}, an e-mail address's
// parts) stays far below it.
const MaxPatternInsts = 2000

// patternInsts is the size of re's compiled program, as the regexp
// package compiles it.
func patternInsts(expr string) (int, error) {
	ast, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return 0, err
	}
	prog, err := syntax.Compile(ast.Simplify())
	if err != nil {
		return 0, err
	}
	return len(prog.Inst), nil
}

// costlyPattern finds a pattern or patternProperties key, in s or any
// schema it reaches, whose program is over MaxPatternInsts.
func costlyPattern(s *jsonschema.Schema) error {
	return eachPattern(s, func(re *regexp.Regexp, where string, x *jsonschema.Schema) error {
		n, err := patternInsts(re.String())
		if err != nil {
			return nil // the regexp compiled, so this does too
		}
		if n > MaxPatternInsts {
			return fmt.Errorf("%s %q at %s compiles to %d regexp instructions, over the limit of %d: matching costs its size times the string's length; use fewer or smaller counted repetitions ({n,m}) and alternatives", where, shortPattern(re.String()), x.Location, n, MaxPatternInsts)
		}
		return nil
	})
}

// patternBound is the largest pattern program (a pattern or a
// patternProperties key) in s or any schema it reaches: what jsonschema
// may run validating a value against s.
func patternBound(s *jsonschema.Schema) int {
	most := 0
	_ = eachPattern(s, func(re *regexp.Regexp, _ string, _ *jsonschema.Schema) error {
		if n, err := patternInsts(re.String()); err == nil {
			most = max(most, n)
		}
		return nil
	})
	return most
}

// eachPattern calls f with each pattern ("pattern") and patternProperties
// key ("patternProperties key") of s and every schema it reaches, and the
// schema that holds it, until f fails.
func eachPattern(s *jsonschema.Schema, f func(re *regexp.Regexp, where string, x *jsonschema.Schema) error) error {
	seen := map[*jsonschema.Schema]bool{}
	var walk func(x *jsonschema.Schema) error
	walk = func(x *jsonschema.Schema) error {
		if x == nil || seen[x] {
			return nil
		}
		seen[x] = true
		if x.Pattern != nil {
			if err := f(x.Pattern, "pattern", x); err != nil {
				return err
			}
		}
		for re := range x.PatternProperties {
			if err := f(re, "patternProperties key", x); err != nil {
				return err
			}
		}
		inPlace, child := subschemas(x)
		for _, sub := range append(inPlace, child...) {
			if err := walk(sub); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(s)
}

// shortPattern cuts a long pattern for an error message.
func shortPattern(p string) string {
	if len(p) <= 80 {
		return p
	}
	return p[:77] + "..."
}

// asciiPattern matches, without the regexp machine, the patterns schemas
// use most for codes and identifiers: anchored at both ends, a sequence of
// ASCII literals and ASCII character classes, each repeated a fixed number
// of times except the last, which may repeat a range (^[A-Z]{3}$,
// ^[A-Z0-9][A-Z0-9-]{2,31}$, ^\+[1-9][0-9]{6,14}$). Such a pattern never
// backtracks: each position is checked once against one set. It accepts
// exactly what the regexp accepts (TestASCIIPatternAgrees); a byte outside
// ASCII is in no set, as the rune it starts (or U+FFFD) is in no ASCII
// class.
type asciiPattern struct {
	runs []asciiRun
}

type asciiRun struct {
	set      [2]uint64 // bit c: byte c is in the set
	min, max int       // max -1: unbounded
}

func (r *asciiRun) has(c byte) bool { return c < 128 && r.set[c>>6]&(1<<(c&63)) != 0 }

// newASCIIPattern compiles re into an asciiPattern, or returns nil when re
// is not of that shape (the regexp then decides).
func newASCIIPattern(re *regexp.Regexp) *asciiPattern {
	if re == nil {
		return nil
	}
	ast, err := syntax.Parse(re.String(), syntax.Perl)
	if err != nil || ast.Op != syntax.OpConcat || len(ast.Sub) < 3 {
		return nil
	}
	subs := ast.Sub
	if subs[0].Op != syntax.OpBeginText || subs[len(subs)-1].Op != syntax.OpEndText {
		return nil
	}
	p := &asciiPattern{}
	for _, sub := range subs[1 : len(subs)-1] {
		min, max := 1, 1
		switch sub.Op {
		case syntax.OpRepeat:
			min, max = sub.Min, sub.Max
		case syntax.OpPlus:
			min, max = 1, -1
		case syntax.OpStar:
			min, max = 0, -1
		case syntax.OpQuest:
			min, max = 0, 1
		}
		if min != 1 || max != 1 || sub.Op == syntax.OpRepeat {
			if len(sub.Sub) != 1 {
				return nil
			}
			sub = sub.Sub[0]
			if sub.Op == syntax.OpLiteral && len(sub.Rune) != 1 {
				return nil
			}
		}
		switch sub.Op {
		case syntax.OpLiteral:
			if sub.Flags&syntax.FoldCase != 0 {
				return nil
			}
			for _, r := range sub.Rune {
				run := asciiRun{min: min, max: max}
				if !run.add(r, r) {
					return nil
				}
				p.runs = append(p.runs, run)
			}
		case syntax.OpCharClass:
			run := asciiRun{min: min, max: max}
			for i := 0; i+1 < len(sub.Rune); i += 2 {
				if !run.add(sub.Rune[i], sub.Rune[i+1]) {
					return nil
				}
			}
			p.runs = append(p.runs, run)
		default:
			return nil
		}
	}
	for i, run := range p.runs {
		if run.max < 0 && i != len(p.runs)-1 || run.max >= 0 && run.max < run.min || run.min != run.max && i != len(p.runs)-1 {
			return nil // only the last run may vary: no backtracking
		}
	}
	return p
}

// add puts the runes lo..hi into the set; false if any is not ASCII.
func (r *asciiRun) add(lo, hi rune) bool {
	if lo < 0 || hi > 127 || lo > hi {
		return false
	}
	for c := lo; c <= hi; c++ {
		r.set[c>>6] |= 1 << (c & 63)
	}
	return true
}

// match reports whether the whole of s matches.
func (p *asciiPattern) match(s string) bool {
	i := 0
	for _, run := range p.runs {
		n := 0
		for i < len(s) && (run.max < 0 || n < run.max) && run.has(s[i]) {
			i++
			n++
		}
		if n < run.min {
			return false
		}
	}
	return i == len(s)
}
