package triage

import (
	"fmt"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
)

// Header values are read with package wire's hardened readers; what is left
// here shapes triage's notes about them.

// minSaneTime: a header time before it is forged or broken.
var minSaneTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// shortValue shows a (possibly forged) scalar for notes, bounded: strings
// truncated, integers and times as such, anything else by its type.
func shortValue(v any) string {
	if s, ok := wireval.String(v); ok {
		return fmt.Sprintf("%q", short(s))
	}
	if n, res := wireval.Int(v); res == wireval.IntOK || res == wireval.IntOverflow {
		return fmt.Sprint(n)
	}
	if t, ok := wireval.Deref(v).(time.Time); ok {
		return t.UTC().Format(time.RFC3339)
	}
	return "(" + wireval.TypeName(v) + ")"
}

// notes collects bounded diagnostics: a hostile header must not make the
// notes themselves unbounded.
type notes struct {
	list    []string
	dropped int
}

const maxNotes = 32

func (n *notes) add(format string, args ...any) {
	if len(n.list) >= maxNotes {
		n.dropped++
		return
	}
	n.list = append(n.list, fmt.Sprintf(format, args...))
}

func (n *notes) result() []string {
	if n.dropped > 0 {
		return append(n.list, fmt.Sprintf("%d more notes omitted", n.dropped))
	}
	return n.list
}
