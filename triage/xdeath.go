package triage

import (
	"math"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Dead-letter reasons the broker writes into x-death.
const (
	ReasonRejected      = "rejected"
	ReasonExpired       = "expired"
	ReasonMaxLen        = "maxlen"
	ReasonDeliveryLimit = "delivery_limit"
)

// maxCount caps one x-death entry's count. Broker counts never get near it;
// a larger value is forged and is clamped (with a note).
const maxCount int64 = math.MaxInt32

// maxEntries bounds how many x-death entries are read. The broker keeps one
// entry per {queue, reason}, so a real history is a handful of entries.
const maxEntries = 256

// Death is one x-death entry: the history of a message's dead-letterings
// from one queue for one reason.
type Death struct {
	Queue    string
	Reason   string
	Exchange string
	// RoutingKeys are the routing keys the message was published with.
	RoutingKeys []string
	// Count is how many times the message was dead-lettered from Queue for
	// Reason, in [0, maxCount].
	Count int64
	// Time is when the message was first dead-lettered from Queue for
	// Reason (second resolution); zero if absent or malformed.
	Time time.Time
	// OriginalExpiration is the per-message TTL the message had, if any.
	OriginalExpiration string
}

// History is a parsed x-death header, newest entry first (as the broker
// orders it). Notes say what was malformed, skipped or clamped.
type History struct {
	Deaths []Death
	Notes  []string
}

// ParseXDeath parses an x-death header value defensively: it accepts an
// array ([]any or any slice type) of tables (map[string]any, amqp.Table or
// any named map with string keys); a single table is read as a one-entry
// array. Counts may be any integer type, an integral float or a
// json.Number; times a time.Time, unix seconds or an RFC 3339 string.
//
// Entries that are not tables or lack a queue or reason are skipped with a
// note. A missing or non-integer count is read as 1 (the entry exists, so
// the message died there at least once); a negative count as 0; a count
// over maxCount as maxCount; each with a note. nil yields an empty History
// without notes. ParseXDeath never panics.
func ParseXDeath(v any) History {
	var n notes
	v = wireval.Deref(v)
	if v == nil {
		return History{}
	}
	list, ok := wireval.List(v)
	if !ok {
		if _, isTable := wireval.Table(v); !isTable {
			n.add("x-death: want an array of tables, got %s; ignored", wireval.TypeName(v))
			return History{Notes: n.result()}
		}
		n.add("x-death: a single table instead of an array; read as one entry")
		list = []any{v}
	}
	if len(list) > maxEntries {
		n.add("x-death: %d entries, only the first %d read", len(list), maxEntries)
		list = list[:maxEntries]
	}
	h := History{Deaths: make([]Death, 0, len(list))}
	seen := make(map[[2]string]bool, len(list))
	for i, raw := range list {
		d, ok := parseDeath(i, raw, &n)
		if !ok {
			continue
		}
		key := [2]string{d.Queue, d.Reason}
		if seen[key] {
			n.add("x-death[%d]: duplicate entry for {%s, %s}", i, short(d.Queue), short(d.Reason))
		}
		seen[key] = true
		h.Deaths = append(h.Deaths, d)
	}
	h.Notes = n.result()
	return h
}

// HistoryOf parses the x-death header of headers (quarantine reads the
// shared tiers' expiry entries with it).
func HistoryOf(headers map[string]any) History {
	return ParseXDeath(headers[wire.HeaderXDeath])
}

func parseDeath(i int, raw any, n *notes) (Death, bool) {
	t, ok := wireval.Table(raw)
	if !ok {
		n.add("x-death[%d]: want a table, got %s; skipped", i, wireval.TypeName(raw))
		return Death{}, false
	}
	var d Death
	d.Queue, _ = wireval.String(t[wire.XDeathQueue])
	d.Reason, _ = wireval.String(t[wire.XDeathReason])
	if d.Queue == "" || d.Reason == "" {
		n.add("x-death[%d]: missing queue or reason; skipped", i)
		return Death{}, false
	}
	d.Exchange, _ = wireval.String(t[wire.XDeathExchange])
	d.OriginalExpiration, _ = wireval.String(t[wire.XDeathOriginalExpiration])
	if keys, ok := wireval.List(t[wire.XDeathRoutingKeys]); ok {
		for _, k := range keys {
			if s, ok := wireval.String(k); ok {
				d.RoutingKeys = append(d.RoutingKeys, s)
			}
		}
	}

	count, res := wireval.Int(t[wire.XDeathCount])
	switch {
	case res == wireval.IntAbsent:
		n.add("x-death[%d] {%s, %s}: count missing; read as 1", i, short(d.Queue), short(d.Reason))
		count = 1
	case res == wireval.IntWrongType:
		n.add("x-death[%d] {%s, %s}: count is %s, not an integer; read as 1", i, short(d.Queue), short(d.Reason), wireval.TypeName(t[wire.XDeathCount]))
		count = 1
	case count < 0:
		n.add("x-death[%d] {%s, %s}: count %d negative; read as 0", i, short(d.Queue), short(d.Reason), count)
		count = 0
	case count > maxCount:
		n.add("x-death[%d] {%s, %s}: count %d clamped to %d", i, short(d.Queue), short(d.Reason), count, maxCount)
		count = maxCount
	}
	d.Count = count

	if tv, present := t[wire.XDeathTime]; present && tv != nil {
		if tm, ok := wireval.Time(tv, time.Second); ok {
			d.Time = tm
		} else {
			n.add("x-death[%d] {%s, %s}: time is malformed (%s); ignored", i, short(d.Queue), short(d.Reason), wireval.TypeName(tv))
		}
	}
	return d, true
}

// Find returns the entry for {queue, reason}, never by position. If a
// forged header repeats the pair, the newest (first) entry wins.
func (h History) Find(queue, reason string) (Death, bool) {
	for _, d := range h.Deaths {
		if d.Queue == queue && d.Reason == reason {
			return d, true
		}
	}
	return Death{}, false
}

// CountWhere sums the counts of the entries keep accepts, saturating at
// math.MaxInt64. A nil keep accepts every entry.
func (h History) CountWhere(keep func(Death) bool) int64 {
	var sum int64
	for _, d := range h.Deaths {
		if keep != nil && !keep(d) {
			continue
		}
		sum = addSat(sum, d.Count)
	}
	return sum
}

// Earliest returns the oldest non-zero entry time.
func (h History) Earliest() (time.Time, bool) {
	var first time.Time
	for _, d := range h.Deaths {
		if !d.Time.IsZero() && (first.IsZero() || d.Time.Before(first)) {
			first = d.Time
		}
	}
	return first, !first.IsZero()
}

// addSat adds two non-negative int64s, saturating at math.MaxInt64.
func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// short truncates a (possibly forged) string for notes.
func short(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	r := []rune(s[:max])
	return string(r) + "…"
}
