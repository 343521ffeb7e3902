package schemas

import (
	"regexp"
	"regexp/syntax"
)

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
