package sidecar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
)

// The console: what the overview filters and sorts by, the arrival
// timelines, the audit listing and the payload's pretty-printing. Every
// view here is computed from the shared payload-free snapshot (see
// pageload.go); nothing in this file reads the broker.

// overviewQuery is the overview's filter, sort and refresh, as its URL
// carries them: a link pasted into an incident channel opens the same view.
type overviewQuery struct {
	Queue, Class, Owner string
	// Text is matched, case-insensitively, inside the error or the reason.
	Text string
	// Last is a window ending now ("1h"); Since and Until a fixed one. One
	// of Last and Since, not both.
	Last         string
	Since, Until time.Time
	// OpenOnly leaves out groups with no open record.
	OpenOnly bool
	// Sort is "count" (most open first, the default), "age" (oldest open
	// first) or "last" (most recently seen first).
	Sort string
	// Refresh, in seconds, reloads the page (0: never).
	Refresh int

	// from is where the window starts, Since or now minus Last.
	from time.Time
}

// lastWindows are the choices of the relative window.
var lastWindows = []struct {
	Value string
	D     time.Duration
}{{"15m", 15 * time.Minute}, {"1h", time.Hour}, {"6h", 6 * time.Hour}, {"24h", 24 * time.Hour}, {"7d", 7 * 24 * time.Hour}}

// sortKeys are the overview's sorts, the default first.
var sortKeys = []struct{ Value, Label string }{{"count", "open count"}, {"age", "oldest open"}, {"last", "last seen"}}

// refreshChoices bound the auto-refresh: no faster than every 10 s (the
// shared snapshot is reused for a few seconds anyway).
var refreshChoices = []int{10, 30, 60, 300}

// timeLayouts are what the time-range fields accept, in UTC unless the
// value names its zone (RFC 3339).
var timeLayouts = []string{time.RFC3339, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"}

func parseWhen(field, v string) (time.Time, error) {
	v = strings.TrimSpace(v)
	for _, l := range timeLayouts {
		if t, err := time.ParseInLocation(l, v, time.UTC); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("%s: %q is not a time: write it as 2006-01-02T15:04 (UTC) or in RFC 3339", field, v)
}

// parseOverview reads the overview's query. Every value it does not know
// is an error that names the field: a mistyped link must not silently
// show everything.
func parseOverview(q url.Values, now time.Time) (overviewQuery, error) {
	o := overviewQuery{Queue: strings.TrimSpace(q.Get("queue")), Class: strings.TrimSpace(q.Get("class")),
		Owner: strings.TrimSpace(q.Get("owner")), Text: strings.TrimSpace(q.Get("text")), Sort: "count"}
	if len(o.Text) > 200 {
		return o, fmt.Errorf("text: %d bytes; search for at most 200", len(o.Text))
	}
	var err error
	if v := q.Get("since"); strings.TrimSpace(v) != "" {
		if o.Since, err = parseWhen("since", v); err != nil {
			return o, err
		}
	}
	if v := q.Get("until"); strings.TrimSpace(v) != "" {
		if o.Until, err = parseWhen("until", v); err != nil {
			return o, err
		}
	}
	if !o.Since.IsZero() && !o.Until.IsZero() && !o.Until.After(o.Since) {
		return o, fmt.Errorf("until (%s) is not after since (%s)", o.Until.Format(time.RFC3339), o.Since.Format(time.RFC3339))
	}
	if v := q.Get("last"); v != "" {
		i := slices.IndexFunc(lastWindows, func(w struct {
			Value string
			D     time.Duration
		}) bool {
			return w.Value == v
		})
		if i < 0 {
			return o, fmt.Errorf("last: %q is not one of 15m, 1h, 6h, 24h, 7d", v)
		}
		if !o.Since.IsZero() {
			return o, fmt.Errorf("last and since both set: choose a window ending now (last) or one from a fixed time (since)")
		}
		o.Last, o.from = v, now.Add(-lastWindows[i].D)
	} else {
		o.from = o.Since
	}
	switch v := q.Get("state"); v {
	case "", "any":
	case "open":
		o.OpenOnly = true
	default:
		return o, fmt.Errorf("state: %q is not open or any", v)
	}
	if v := q.Get("sort"); v != "" {
		if !slices.ContainsFunc(sortKeys, func(k struct{ Value, Label string }) bool { return k.Value == v }) {
			return o, fmt.Errorf("sort: %q is not one of count, age, last", v)
		}
		o.Sort = v
	}
	if v := q.Get("refresh"); v != "" && v != "0" {
		n, err := strconv.Atoi(v)
		if err != nil || !slices.Contains(refreshChoices, n) {
			return o, fmt.Errorf("refresh: %q is not one of 10, 30, 60, 300 (seconds) or 0", v)
		}
		o.Refresh = n
	}
	return o, nil
}

// Values is o as a query, without its defaults.
func (o overviewQuery) Values() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("queue", o.Queue)
	set("class", o.Class)
	set("owner", o.Owner)
	set("text", o.Text)
	set("last", o.Last)
	if !o.Since.IsZero() {
		v.Set("since", o.Since.Format("2006-01-02T15:04:05"))
	}
	if !o.Until.IsZero() {
		v.Set("until", o.Until.Format("2006-01-02T15:04:05"))
	}
	if o.OpenOnly {
		v.Set("state", "open")
	}
	if o.Sort != "count" {
		set("sort", o.Sort)
	}
	if o.Refresh > 0 {
		v.Set("refresh", strconv.Itoa(o.Refresh))
	}
	return v
}

// Link is the overview under o.
func (o overviewQuery) Link() string {
	if e := o.Values().Encode(); e != "" {
		return "/quarantine?" + e
	}
	return "/quarantine"
}

// With is o's link with one setting changed ("" removes it).
func (o overviewQuery) With(key, value string) string {
	v := o.Values()
	if value == "" {
		v.Del(key)
	} else {
		v.Set(key, value)
	}
	if e := v.Encode(); e != "" {
		return "/quarantine?" + e
	}
	return "/quarantine"
}

// Filtered reports whether o selects less than every record.
func (o overviewQuery) Filtered() bool {
	return o.Queue != "" || o.Class != "" || o.Owner != "" || o.Text != "" || !o.from.IsZero() || !o.Until.IsZero() || o.OpenOnly
}

// SinceField and UntilField are the fields' values as typed back.
func (o overviewQuery) SinceField() string { return fieldTime(o.Since) }
func (o overviewQuery) UntilField() string { return fieldTime(o.Until) }

func fieldTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04")
}

// matchSeen reports whether seen lies in o's window.
func (o overviewQuery) matchSeen(seen time.Time) bool {
	return (o.from.IsZero() || !seen.Before(o.from)) && (o.Until.IsZero() || seen.Before(o.Until))
}

// match reports whether r passes o's filter.
func (o overviewQuery) match(r *quarantine.Record) bool {
	if o.Queue != "" && r.Queue != o.Queue || o.Class != "" && string(r.Envelope.Class) != o.Class ||
		o.Owner != "" && ownerName(r.Owner) != o.Owner || !o.matchSeen(r.Seen()) {
		return false
	}
	return o.Text == "" || containsFold(r.Envelope.Error, o.Text) || containsFold(r.Envelope.Reason, o.Text)
}

// matchGone is match for a record the broker's retention removed: only
// its group and time are left, so a text filter leaves it out.
func (o overviewQuery) matchGone(g quarantine.ExpiredRecord) bool {
	return o.Text == "" && (o.Queue == "" || g.Queue == o.Queue) && (o.Class == "" || g.Class == o.Class) &&
		(o.Owner == "" || ownerName(g.Owner) == o.Owner) && o.matchSeen(g.Seen)
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

// ownerName is what the owner filter matches: the team, or the contact of
// an owner without one.
func ownerName(o config.Owner) string {
	if o.Team != "" {
		return o.Team
	}
	return o.Contact
}

// filterChoices are the overview's select options: the configured queues
// and owners, and the classes present.
type filterChoices struct {
	Queues, Classes, Owners []string
	Last                    []string
	Sorts                   []struct{ Value, Label string }
	Refresh                 []int
}

func choicesOf(cfg *config.Config, snap *quarantine.Snapshot) filterChoices {
	c := filterChoices{Sorts: sortKeys, Refresh: refreshChoices}
	for _, w := range lastWindows {
		c.Last = append(c.Last, w.Value)
	}
	add := func(list *[]string, s string) {
		if s != "" && !slices.Contains(*list, s) {
			*list = append(*list, s)
		}
	}
	for i := range cfg.Queues {
		add(&c.Queues, cfg.Queues[i].Name)
		add(&c.Owners, ownerName(cfg.Queues[i].Owner))
	}
	for _, r := range snap.Records {
		add(&c.Queues, r.Queue)
		add(&c.Classes, string(r.Envelope.Class))
		add(&c.Owners, ownerName(r.Owner))
	}
	sort.Strings(c.Classes)
	sort.Strings(c.Owners)
	return c
}

// totals is the line at the top of the overview: what the filter selects.
type totals struct {
	Groups, Open, Replayed, Purged, Expired int
	Queues                                  int // queues with an open record
	OldestOpen                              quarantine.Seconds
	// AllOpen is every open record, filter or not.
	AllOpen int
	// Listed is how many of the Groups the overview lists (pageGroups at
	// most, the first in its order).
	Listed int
}

// groupKey is a group's queue, class and fingerprint.
type groupKey [3]string

func keyOf(r *quarantine.Record) groupKey {
	return groupKey{r.Queue, string(r.Envelope.Class), r.Envelope.Fingerprint}
}

// overviewOf is the overview's groups under o, sorted, their totals, and
// the window their timelines share.
func overviewOf(snap *quarantine.Snapshot, o overviewQuery) ([]groupRow, totals, window) {
	sub := &quarantine.Snapshot{At: snap.At}
	seen := map[groupKey][]time.Time{}
	var tot totals
	for _, r := range snap.Records {
		if r.State == quarantine.StateOpen {
			tot.AllOpen++
		}
		if o.match(r) {
			sub.Records = append(sub.Records, r)
			seen[keyOf(r)] = append(seen[keyOf(r)], r.Seen())
		}
	}
	for _, g := range snap.Gone {
		if o.matchGone(g) {
			sub.Gone = append(sub.Gone, g)
			k := groupKey{g.Queue, g.Class, g.Fingerprint}
			seen[k] = append(seen[k], g.Seen)
		}
	}
	counts := countVerdicts(sub)
	var rows []groupRow
	queues := map[string]bool{}
	for _, g := range sub.Stats(quarantine.Filter{}) {
		if o.OpenOnly && g.Open == 0 {
			continue
		}
		q := groupQuery(g.Queue, g.Class, g.Fingerprint)
		if o.Filtered() || o.Sort != "count" || o.Refresh > 0 {
			q.Set("back", o.Values().Encode())
		}
		rows = append(rows, groupRow{Group: g, Link: "/quarantine/group?" + q.Encode(), Query: q,
			Envelopes: counts[groupKey{g.Queue, g.Class, g.Fingerprint}], Short: shorten(g.Example, 160)})
		tot.Groups++
		tot.Open += g.Open
		tot.Replayed += g.Replayed
		tot.Purged += g.Purged
		tot.Expired += g.Expired
		tot.OldestOpen = max(tot.OldestOpen, g.OldestOpenAge)
		if g.Open > 0 {
			queues[g.Queue] = true
		}
	}
	tot.Queues = len(queues)
	switch o.Sort {
	case "age":
		sort.SliceStable(rows, func(i, j int) bool {
			if rows[i].OldestOpenAge != rows[j].OldestOpenAge {
				return rows[i].OldestOpenAge > rows[j].OldestOpenAge
			}
			return rows[i].Open > rows[j].Open
		})
	case "last":
		sort.SliceStable(rows, func(i, j int) bool { return rows[i].LastSeen.After(rows[j].LastSeen) })
	}
	tot.Listed = min(len(rows), pageGroups)
	rows = rows[:tot.Listed]
	win := window{From: o.from, To: o.Until}
	if win.To.IsZero() {
		win.To = snap.At
	}
	if win.From.IsZero() {
		for _, r := range rows {
			if win.From.IsZero() || r.FirstSeen.Before(win.From) {
				win.From = r.FirstSeen
			}
		}
	}
	win = win.fit()
	for i := range rows {
		rows[i].Timeline = win.timeline(seen[groupKey{rows[i].Queue, rows[i].Class, rows[i].Fingerprint}], overviewBins, 96, 24)
	}
	return rows, tot, win
}

// overviewBins and groupBins are how many bars a timeline has.
const (
	overviewBins = 24
	groupBins    = 60
)

// window is the time span a timeline covers.
type window struct{ From, To time.Time }

// fit gives w a span of at least minSpan ending at To (an empty or
// one-instant window has no width to divide).
func (w window) fit() window {
	const minSpan = 10 * time.Minute
	if w.From.IsZero() || w.To.Sub(w.From) < minSpan {
		w.From = w.To.Add(-minSpan)
	}
	return w
}

// timeline is a small bar chart of arrivals, drawn as inline SVG (an
// element, not a script: the page's CSP lets it render). The bars are
// shapes in the text's colour and Label says the same in words, so it
// reads without colour and to a screen reader.
type timeline struct {
	W, H  int
	Bars  []timelineBar
	Label string
	Total int
}

type timelineBar struct{ X, Y, W, H int }

// timeline bins times over w into bins bars of a width×height chart.
func (w window) timeline(times []time.Time, bins, width, height int) timeline {
	t := timeline{W: width, H: height}
	counts := make([]int, bins)
	// In seconds, as floats: a duration's product with bins wraps for a
	// window over about twelve years, and a Duration itself caps at 292.
	from, span := seconds(w.From), seconds(w.To)-seconds(w.From)
	for _, at := range times {
		if at.Before(w.From) || at.After(w.To) {
			continue
		}
		i := int((seconds(at) - from) / span * float64(bins))
		counts[max(0, min(i, bins-1))]++
		t.Total++
	}
	peak := slices.Max(counts)
	bw := width / bins
	for i, n := range counts {
		if n == 0 {
			continue
		}
		h := max(2, n*(height-1)/peak)
		t.Bars = append(t.Bars, timelineBar{X: i * bw, Y: height - 1 - h, W: max(1, bw-1), H: h})
	}
	step := time.Duration(min(span/float64(bins), float64(math.MaxInt64)/1e9) * 1e9).Round(time.Second)
	t.Label = fmt.Sprintf("%d arrival(s) from %s to %s", t.Total, stamp(w.From), stamp(w.To))
	if t.Total > 0 {
		t.Label += fmt.Sprintf("; at most %d in one %s interval", peak, compact(step))
	}
	return t
}

// seconds is t in seconds since 1970, fractions included.
func seconds(t time.Time) float64 {
	return float64(t.Unix()) + float64(t.Nanosecond())/1e9
}

// groupTimeline is a group page's timeline: its own span, to now.
func groupTimeline(g quarantine.Group, recs []*quarantine.Record, now time.Time) timeline {
	times := make([]time.Time, len(recs))
	for i, r := range recs {
		times[i] = r.Seen()
	}
	return window{From: g.FirstSeen, To: now}.fit().timeline(times, groupBins, 480, 40)
}

// stamp is a time as the page writes it: UTC, to the second.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// compact writes d in its two largest units: 45s, 12m30s, 3h02m, 2d04h
// (a zero second unit left out: 1h, 2d).
func compact(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		m, s := int(d/time.Minute), int(d%time.Minute/time.Second)
		if s == 0 {
			return fmt.Sprintf("%dm", m)
		}
		return fmt.Sprintf("%dm%02ds", m, s)
	case d < 24*time.Hour:
		h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh%02dm", h, m)
	}
	days, h := int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour)
	if h == 0 {
		return fmt.Sprintf("%dd", days)
	}
	return fmt.Sprintf("%dd%02dh", days, h)
}

// shorten is s on one line, cut to at most n runes with an ellipsis.
func shorten(s string, n int) string {
	var b strings.Builder
	space, runes := false, 0
	for _, r := range s {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			space = b.Len() > 0
			continue
		}
		if space {
			b.WriteByte(' ')
			runes++
			space = false
		}
		if runes >= n {
			return strings.TrimSpace(b.String()) + "…"
		}
		b.WriteRune(r)
		runes++
	}
	return b.String()
}

// recordRow is one record of a group's list.
type recordRow struct {
	*quarantine.Record
	Age   string
	Short string
	// Selectable: a replay or purge may pick it (open or expired).
	Selectable bool
}

// stateOrder lists a group's open records first, then the ones a purge
// may still take, then the resolved ones.
var stateOrder = map[quarantine.State]int{quarantine.StateOpen: 0, quarantine.StateExpired: 1, quarantine.StateReplayed: 2, quarantine.StatePurged: 3}

func recordRows(recs []*quarantine.Record, now time.Time) []recordRow {
	sort.SliceStable(recs, func(i, j int) bool { return stateOrder[recs[i].State] < stateOrder[recs[j].State] })
	out := make([]recordRow, len(recs))
	for i, r := range recs {
		out[i] = recordRow{Record: r, Age: compact(now.Sub(r.Seen())), Short: shorten(errorOf(r), 200),
			Selectable: r.State == quarantine.StateOpen || r.State == quarantine.StateExpired}
	}
	return out
}

func errorOf(r *quarantine.Record) string {
	if r.Envelope.Error != "" {
		return r.Envelope.Error
	}
	return r.Envelope.Reason
}

// historyRow is another quarantine of the same message.
type historyRow struct {
	*quarantine.Record
	Earlier bool
	Short   string
}

func historyRows(rec *quarantine.Record, others []*quarantine.Record) []historyRow {
	out := make([]historyRow, len(others))
	for i, r := range others {
		out[i] = historyRow{Record: r, Earlier: r.Seen().Before(rec.Seen()), Short: shorten(errorOf(r), 160)}
	}
	return out
}

// The audit listing shows the newest auditPage events, and links to older
// ones.
const auditPage = 100

// auditQuery is the audit page's filter.
type auditQuery struct {
	Queue, Kind, Run string
	Offset           int
}

func parseAudit(q url.Values, cfg *config.Config) (auditQuery, error) {
	a := auditQuery{Queue: q.Get("queue"), Kind: q.Get("kind"), Run: q.Get("run")}
	if _, ok := cfg.QueueByName(a.Queue); a.Queue != "" && !ok {
		return a, fmt.Errorf("queue: %q is not a configured queue", a.Queue)
	}
	if a.Kind != "" && !slices.Contains(eventKinds, a.Kind) {
		return a, fmt.Errorf("kind: %q is not one of %s", a.Kind, strings.Join(eventKinds, ", "))
	}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return a, fmt.Errorf("offset: %q is not a count", v)
		}
		a.Offset = n
	}
	return a, nil
}

var eventKinds = []string{quarantine.EventReplayStarted, quarantine.EventReplayed, quarantine.EventReplayFinished,
	quarantine.EventReplayRefused, quarantine.EventPurged, quarantine.EventClaimed, quarantine.EventExpired}

func (a auditQuery) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"queue": a.Queue, "kind": a.Kind, "run": a.Run} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// auditRow is one event as the audit page lists it: its first ids, and
// how many more it names.
type auditRow struct {
	quarantine.Event
	Shown []string
	More  int
}

// auditIDs bounds the ids an audit row links to.
const auditIDs = 6

// auditOf is the events a selects, newest first, one page of them, and
// how many it selects in all.
func auditOf(snap *quarantine.Snapshot, cfg *config.Config, a auditQuery) ([]auditRow, int) {
	intake := ""
	if a.Queue != "" {
		q, _ := cfg.QueueByName(a.Queue)
		intake = q.Quarantine.Queue
	}
	var rows []auditRow
	n := 0
	for i := len(snap.Events) - 1; i >= 0; i-- {
		e := snap.Events[i]
		if intake != "" && e.Quarantine != intake || a.Kind != "" && e.Kind != a.Kind || a.Run != "" && e.Run != a.Run {
			continue
		}
		n++
		if n <= a.Offset || len(rows) >= auditPage {
			continue
		}
		row := auditRow{Event: e}
		ids := e.IDs
		if len(ids) == 0 {
			for _, x := range e.Expired {
				ids = append(ids, x.ID)
			}
		}
		row.Shown, row.More = ids[:min(len(ids), auditIDs)], max(0, len(ids)-auditIDs)
		rows = append(rows, row)
	}
	return rows, n
}

// prettyCap bounds a pretty-printed payload: indenting deep nesting can
// grow a payload many times over, and the page must stay small.
const prettyCap = 4 * pagePayload

// prettyJSON indents a whole JSON text by two spaces per level; false if
// body is not one JSON value or the result would pass prettyCap.
func prettyJSON(body []byte) (string, bool) {
	if !json.Valid(body) {
		return "", false
	}
	var out bytes.Buffer
	depth, inString, escaped := 0, false, false
	newline := func() bool {
		out.WriteByte('\n')
		for range depth {
			out.WriteString("  ")
		}
		return out.Len() <= prettyCap
	}
	// next returns the next byte after i that is not white space.
	next := func(i int) byte {
		for j := i + 1; j < len(body); j++ {
			if c := body[j]; c != ' ' && c != '\t' && c != '\n' && c != '\r' {
				return c
			}
		}
		return 0
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		if inString {
			out.WriteByte(c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '"':
			inString = true
			out.WriteByte(c)
		case '{', '[':
			out.WriteByte(c)
			if n := next(i); n == '}' || n == ']' {
				continue // an empty object or array stays on its line
			}
			depth++
			if !newline() {
				return "", false
			}
		case '}', ']':
			if p := out.Bytes(); len(p) > 0 && (p[len(p)-1] == '{' || p[len(p)-1] == '[') {
				out.WriteByte(c)
				continue
			}
			depth--
			if !newline() {
				return "", false
			}
			out.WriteByte(c)
		case ',':
			out.WriteByte(c)
			if !newline() {
				return "", false
			}
		case ':':
			out.WriteString(": ")
		default:
			out.WriteByte(c)
		}
		if out.Len() > prettyCap {
			return "", false
		}
	}
	if !utf8.Valid(out.Bytes()) {
		return "", false
	}
	return out.String(), true
}
