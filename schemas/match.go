package schemas

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"time"
	"unicode/utf8"
)

// The gate's pattern matching. Go's regexp runs in time proportional to the
// string's length times the pattern's program (MaxPatternInsts bounds the
// program; a producer chooses the length): a pattern under the bound still
// took seconds on a 256 KiB string, the gate's paths ran it up to four times
// on the same value, and nothing could stop a match once begun. So a match
// that may be costly (costlyMatch) runs here instead: once per pattern and
// value in one check (a check's run remembers the verdicts), on a
// machine that looks at the check's context every few thousand steps and
// stops when it ends. A cheap match stays with the regexp package.

// costlyMatch is the cost, in program instructions times (the string's
// length + 1), above which a match may take more than about a millisecond:
// from there it is remembered and can be stopped. A pattern of 2,000
// instructions is cheap up to a 64-byte string; one of 500, up to 261 bytes.
const costlyMatch = 1 << 17

// checkEvery is how many thread steps the machine takes between looks at
// the check's context: well under a millisecond.
const checkEvery = 1 << 14

// pattern is a compiled pattern as the gate matches it.
type pattern struct {
	re       *regexp.Regexp
	prog     *syntax.Prog
	insts    int
	anchored bool // the program must match at the string's start
	never    bool // the program matches nothing
}

// newPattern compiles re's program as the regexp package does (Perl syntax,
// simplified). A pattern whose program does not compile here, which cannot
// happen for one the regexp package compiled, is matched by the regexp
// package alone.
func newPattern(re *regexp.Regexp) *pattern {
	p := &pattern{re: re}
	ast, err := syntax.Parse(re.String(), syntax.Perl)
	if err != nil {
		return p
	}
	prog, err := syntax.Compile(ast.Simplify())
	if err != nil {
		return p
	}
	p.prog, p.insts = prog, len(prog.Inst)
	switch cond := prog.StartCond(); {
	case cond == ^syntax.EmptyOp(0):
		p.never = true
	case cond&syntax.EmptyBeginText != 0:
		p.anchored = true
	}
	return p
}

// costly reports whether matching a string of n bytes may cost more than
// costlyMatch.
func (p *pattern) costly(n int) bool {
	return p.prog != nil && p.insts*(n+1) > costlyMatch
}

// ErrStopped wraps the context's error when a check stopped at its
// deadline, or was cancelled, before it could say whether the message is
// valid: the message was not found invalid, and is not a
// *ValidationError.
var ErrStopped = errors.New("schemas: the check stopped before it finished")

// run is one check's share of the pattern work: the verdicts of its costly
// matches, and its context. The zero run (no context) remembers and never
// stops.
type run struct {
	done <-chan struct{}
	ctx  context.Context
	// deadline is ctx's, which the run also compares the time with: a
	// context may have a deadline and no timer to close its Done.
	deadline    time.Time
	hasDeadline bool
	memo        map[memoKey]bool
	// runs counts the costly matches run (tests read it).
	runs int
	// err is set once a match stopped for the context: every verdict
	// of the check is void from then on.
	err error
}

// memoKey is a pattern's expression (two places in a schema may state the
// same one) and a value.
type memoKey struct {
	expr, s string
}

// start readies r for a check under ctx.
func (r *run) start(ctx context.Context) {
	r.ctx, r.done, r.err = ctx, ctx.Done(), nil
	r.deadline, r.hasDeadline = ctx.Deadline()
}

// reset forgets the check: its strings may be views of a body that is
// going away.
func (r *run) reset() {
	clear(r.memo)
	r.ctx, r.done, r.err, r.deadline, r.hasDeadline, r.runs = nil, nil, nil, time.Time{}, false, 0
}

// stopped reports whether the check's context has ended, and if so
// records why.
func (r *run) stopped() bool {
	if r == nil {
		return false
	}
	if r.err != nil {
		return true
	}
	if r.done != nil {
		select {
		case <-r.done:
			r.err = fmt.Errorf("%w: %w", ErrStopped, r.ctx.Err())
			return true
		default:
		}
	}
	if r.hasDeadline && !time.Now().Before(r.deadline) {
		r.err = fmt.Errorf("%w: %w", ErrStopped, context.DeadlineExceeded)
		return true
	}
	return false
}

// match reports whether p matches s. A costly match runs once per value in
// the check, and once the check's context ends it returns false at once
// (the check's verdict is void then: see err).
func (r *run) match(p *pattern, s string) bool {
	if r == nil || !p.costly(len(s)) {
		return p.re.MatchString(s)
	}
	if r.err != nil || r.stopped() {
		return false
	}
	k := memoKey{p.re.String(), s}
	if ok, seen := r.memo[k]; seen {
		return ok
	}
	r.runs++
	ok, stopped := p.match(s, r.stopped)
	if stopped {
		return false
	}
	if r.memo == nil {
		r.memo = map[memoKey]bool{}
	}
	r.memo[k] = ok
	return ok
}

// match runs p's program over s, as a set of threads advanced one rune at a
// time (the regexp package's NFA, for a yes or no), calling stop every
// checkEvery thread steps; stopped: stop said so, and ok means nothing.
func (p *pattern) match(s string, stop func() bool) (ok, stopped bool) {
	if p.never {
		return false, false
	}
	m := machine{prog: p.prog, cur: newThreadSet(p.insts), next: newThreadSet(p.insts)}
	start := uint32(p.prog.Start)
	r, w := runeAt(s, 0)
	if m.add(&m.cur, start, syntax.EmptyOpContext(-1, r)) {
		return true, false
	}
	steps := 0
	for pos := 0; r != -1; {
		at := pos + w
		r2, w2 := runeAt(s, at)
		flags := syntax.EmptyOpContext(r, r2)
		m.next.clear()
		for _, pc := range m.cur.dense {
			in := &p.prog.Inst[pc]
			var take bool
			switch in.Op {
			case syntax.InstRune:
				take = in.MatchRune(r)
			case syntax.InstRune1:
				take = r == in.Rune[0]
			case syntax.InstRuneAny:
				take = true
			case syntax.InstRuneAnyNotNL:
				take = r != '\n'
			default:
				continue
			}
			if take && m.add(&m.next, in.Out, flags) {
				return true, false
			}
		}
		steps += len(m.cur.dense) + 1
		// A match may also begin at the next position.
		if !p.anchored && m.add(&m.next, start, flags) {
			return true, false
		}
		m.cur, m.next = m.next, m.cur
		pos, r, w = at, r2, w2
		if len(m.cur.dense) == 0 && p.anchored {
			return false, false
		}
		if steps >= checkEvery {
			steps = 0
			if stop() {
				return false, true
			}
		}
	}
	return false, false
}

// runeAt decodes the rune at s[i:] as the regexp package does (an invalid
// byte is utf8.RuneError of width 1); -1 at the end.
func runeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

type machine struct {
	prog      *syntax.Prog
	cur, next threadSet
	stack     []uint32
}

// add adds pc and every instruction it reaches without consuming a rune,
// at a position whose empty-width context is flags, to l; true when one of
// them is a match.
func (m *machine) add(l *threadSet, pc uint32, flags syntax.EmptyOp) bool {
	m.stack = append(m.stack[:0], pc)
	for len(m.stack) > 0 {
		pc := m.stack[len(m.stack)-1]
		m.stack = m.stack[:len(m.stack)-1]
		if l.has(pc) {
			continue
		}
		l.add(pc)
		in := &m.prog.Inst[pc]
		switch in.Op {
		case syntax.InstMatch:
			return true
		case syntax.InstAlt, syntax.InstAltMatch:
			m.stack = append(m.stack, in.Arg, in.Out)
		case syntax.InstEmptyWidth:
			if syntax.EmptyOp(in.Arg)&^flags == 0 {
				m.stack = append(m.stack, in.Out)
			}
		case syntax.InstNop, syntax.InstCapture:
			m.stack = append(m.stack, in.Out)
		}
	}
	return false
}

// threadSet is a sparse set of instruction indexes: clear, add and has in
// constant time, members in the order added.
type threadSet struct {
	dense, sparse []uint32
}

func newThreadSet(n int) threadSet {
	return threadSet{dense: make([]uint32, 0, n), sparse: make([]uint32, n)}
}

func (t *threadSet) has(pc uint32) bool {
	i := t.sparse[pc]
	return int(i) < len(t.dense) && t.dense[i] == pc
}

func (t *threadSet) add(pc uint32) {
	t.sparse[pc] = uint32(len(t.dense))
	t.dense = append(t.dense, pc)
}

func (t *threadSet) clear() { t.dense = t.dense[:0] }
