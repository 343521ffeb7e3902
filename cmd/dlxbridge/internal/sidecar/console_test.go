package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// consoleAt is the fake snapshots' time.
var consoleAt = time.Date(2025, 3, 4, 12, 0, 0, 0, time.UTC)

// fakeRecord is a record as a payload-free snapshot holds it.
func fakeRecord(id, queue, class, fp, errText string, ago time.Duration, state quarantine.State, team string) *quarantine.Record {
	return &quarantine.Record{ID: id, Queue: queue, Intake: queue + ".quarantine", StoredAt: consoleAt.Add(-ago), State: state,
		Owner: config.Owner{Team: team, Contact: "#" + team},
		Envelope: quarantine.Envelope{Source: quarantine.SourceBridge, Class: triage.Class(class), Fingerprint: fp, Error: errText,
			Reason: class + " failure", QuarantinedAt: consoleAt.Add(-ago)},
		Properties: quarantine.Properties{MessageID: "m-" + id}}
}

// fakeConsole is a page over a fixed snapshot: orders has a schema group
// (3 open, one replayed) and a permanent one; billing one permanent
// group. No broker: what these tests check needs no payload.
func fakeConsole(t *testing.T, token string) (*httptest.Server, *quarantine.Snapshot) {
	t.Helper()
	snap := &quarantine.Snapshot{At: consoleAt, Intake: map[string]int{}, Records: []*quarantine.Record{
		fakeRecord("aaaa00000001", "orders", "schema", "fp-schema", "additionalProperties 'amountCents' not allowed", 5*time.Hour, quarantine.StateOpen, "payments"),
		fakeRecord("aaaa00000002", "orders", "schema", "fp-schema", "additionalProperties 'amountCents' not allowed", 2*time.Hour, quarantine.StateOpen, "payments"),
		fakeRecord("aaaa00000003", "orders", "schema", "fp-schema", "additionalProperties 'amountCents' not allowed", 30*time.Minute, quarantine.StateOpen, "payments"),
		fakeRecord("aaaa00000004", "orders", "schema", "fp-schema", "additionalProperties 'amountCents' not allowed", 6*time.Hour, quarantine.StateReplayed, "payments"),
		fakeRecord("bbbb00000001", "orders", "permanent", "fp-flagged", "422 Unprocessable Entity: customer is flagged bad", 10*time.Minute, quarantine.StateOpen, "payments"),
		fakeRecord("cccc00000001", "billing", "permanent", "fp-billing", "402 Payment Required: card declined\n  at charge()", 50*time.Hour, quarantine.StateOpen, "billing"),
	}}
	for i := 0; i < 150; i++ {
		snap.Events = append(snap.Events, quarantine.Event{Kind: quarantine.EventReplayed, At: consoleAt.Add(time.Duration(i-200) * time.Minute),
			By: fmt.Sprintf("web:op%d", i), Run: fmt.Sprintf("run-%03d", i), Quarantine: "orders.quarantine", IDs: []string{"aaaa00000004"}})
	}
	cfg := &config.Config{Queues: []config.Queue{
		{Name: "orders", Owner: config.Owner{Team: "payments"}, Quarantine: config.Quarantine{Queue: "orders.quarantine"}},
		{Name: "billing", Owner: config.Owner{Team: "billing"}, Quarantine: config.Quarantine{Queue: "billing.quarantine"}},
	}}
	p := &Page{Config: cfg, Token: token, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Dial: func() (*amqp.Connection, error) { return nil, errors.New("no broker in this test") },
		read: func(context.Context) (*quarantine.Snapshot, error) { return snap, nil }}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return srv, snap
}

var groupRowRE = regexp.MustCompile(`(?s)<tr class="group" data-queue="([^"]*)" data-fingerprint="([^"]*)">(.*?)</tr>`)

// overviewGroups are the fingerprints the overview lists, in order.
func overviewGroups(t *testing.T, srv *httptest.Server, query string) ([]string, string) {
	t.Helper()
	code, body := get(t, srv.URL+"/quarantine?"+query)
	if code != http.StatusOK {
		t.Fatalf("GET /quarantine?%s: %d\n%s", query, code, body)
	}
	var fps []string
	for _, m := range groupRowRE.FindAllStringSubmatch(body, -1) {
		fps = append(fps, m[2])
	}
	return fps, body
}

// The overview says what went wrong per group and filters and sorts by
// what the URL says; every filter is in the link, so a pasted link shows
// the same groups, and its form shows the same settings.
func TestOverviewFiltersAndSortsFromTheURL(t *testing.T) {
	t.Parallel()
	srv, _ := fakeConsole(t, "")
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", []string{"fp-schema", "fp-billing", "fp-flagged"}},
		{"sort=age", []string{"fp-billing", "fp-schema", "fp-flagged"}},
		{"sort=last", []string{"fp-flagged", "fp-schema", "fp-billing"}},
		{"queue=billing", []string{"fp-billing"}},
		{"class=permanent", []string{"fp-billing", "fp-flagged"}},
		{"owner=billing", []string{"fp-billing"}},
		{"text=FLAGGED", []string{"fp-flagged"}},
		{"text=schema+failure", []string{"fp-schema"}}, // the reason
		{"last=1h", []string{"fp-schema", "fp-flagged"}},
		{"since=2025-03-04T09:00&until=2025-03-04T11:45", []string{"fp-schema"}},
		{"since=2025-03-01T00:00&queue=orders&class=schema&text=amount&sort=age", []string{"fp-schema"}},
		{"text=nothing+like+this", nil},
	} {
		got, body := overviewGroups(t, srv, c.query)
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("?%s lists %v, want %v", c.query, got, c.want)
		}
		q, _ := url.ParseQuery(c.query)
		for k, vs := range q {
			v := vs[0]
			switch k {
			case "text", "since", "until":
				if !strings.Contains(body, `name="`+k+`" id="f-`+k+`" value="`+v) {
					t.Errorf("?%s: the form does not show %s=%q", c.query, k, v)
				}
			case "sort":
				if !strings.Contains(body, `<option value="`+v+`" selected>`) {
					t.Errorf("?%s: the form does not show sort=%s", c.query, v)
				}
			default:
				if !strings.Contains(body, `<option value="`+v+`" selected>`+v+`</option>`) {
					t.Errorf("?%s: the form does not show %s=%s", c.query, k, v)
				}
			}
		}
	}
	// The form's empty fields are left out of the link the page answers
	// under.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/quarantine?queue=&class=&owner=billing&text=&last=&since=&until=&state=&sort=count&refresh=", nil)
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/quarantine?owner=billing" {
		t.Errorf("the form's query: %d to %q, want 303 to /quarantine?owner=billing", resp.StatusCode, resp.Header.Get("Location"))
	}
	// The schema group's time window selects 2 of its 3 open records: the
	// counts and totals are the filter's.
	_, body := overviewGroups(t, srv, "since=2025-03-04T09:00&until=2025-03-04T11:45")
	m := groupRowRE.FindStringSubmatch(body)
	if !strings.Contains(m[3], `<td class="num open">2</td>`) || !strings.Contains(body, `id="total-open">2</strong> open (of 5 in all)`) {
		t.Errorf("a time window's counts:\n%s", m[3])
	}
	// What went wrong is the error, not the class.
	_, body = overviewGroups(t, srv, "")
	for _, want := range []string{"additionalProperties &#39;amountCents&#39; not allowed", "422 Unprocessable Entity: customer is flagged bad",
		"402 Payment Required: card declined at charge()", `id="total-open">5</strong> open</li>`, `id="total-groups">3</strong>`} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	// A group's link carries the overview it came from, and its back link
	// returns there.
	_, body = overviewGroups(t, srv, "text=flagged&sort=last")
	link := regexp.MustCompile(`class="group-link" href="([^"]+)"`).FindStringSubmatch(body)
	if link == nil {
		t.Fatal("no group link")
	}
	code, page := get(t, srv.URL+strings.ReplaceAll(link[1], "&amp;", "&"))
	if code != http.StatusOK || !strings.Contains(page, `href="/quarantine?sort=last&amp;text=flagged" id="back-overview"`) {
		t.Errorf("group page from a filtered overview: %d, back link:\n%s", code, regexp.MustCompile(`.*back-overview.*`).FindString(page))
	}
}

// A link with a setting the page does not know says which and why,
// rather than showing everything.
func TestOverviewRefusesWhatItCannotRead(t *testing.T) {
	t.Parallel()
	srv, _ := fakeConsole(t, "")
	for query, want := range map[string]string{
		"since=yesterday":                   `since: &#34;yesterday&#34; is not a time`,
		"sort=oldest":                       `sort: &#34;oldest&#34; is not one of count, age, last`,
		"last=2h":                           `last: &#34;2h&#34; is not one of`,
		"last=1h&since=2025-03-01":          `last and since both set`,
		"refresh=1":                         `refresh: &#34;1&#34; is not one of 10, 30, 60, 300`,
		"since=2025-03-02&until=2025-03-01": `until (2025-03-01T00:00:00Z) is not after since`,
		"state=closed":                      `state: &#34;closed&#34; is not open or any`,
	} {
		code, body := get(t, srv.URL+"/quarantine?"+query)
		if code != http.StatusBadRequest || !strings.Contains(body, want) {
			t.Errorf("?%s: %d, want 400 with %q:\n%s", query, code, want, body)
		}
	}
}

// ?refresh=30 reloads the page by a meta element (no script), and the
// page says so with a link that stops it; without it nothing reloads.
func TestOverviewAutoRefreshNeedsNoScript(t *testing.T) {
	t.Parallel()
	srv, _ := fakeConsole(t, "")
	_, body := overviewGroups(t, srv, "refresh=30&queue=orders")
	if !strings.Contains(body, `<meta http-equiv="refresh" content="30">`) || !strings.Contains(body, `href="/quarantine?queue=orders">stop</a>`) {
		t.Errorf("refresh=30: no meta refresh or no stop link:\n%s", body)
	}
	if strings.Contains(body, "<script") {
		t.Error("the page holds a script")
	}
	if _, body = overviewGroups(t, srv, ""); strings.Contains(body, `http-equiv="refresh"`) {
		t.Error("the page reloads without refresh=")
	}
}

// Each group's arrivals are drawn as inline SVG bars, one per interval
// with arrivals, over a window the groups share, and said in words.
func TestTimelineBinsArrivals(t *testing.T) {
	t.Parallel()
	w := window{From: consoleAt.Add(-24 * time.Hour), To: consoleAt}
	var times []time.Time
	for i := 0; i < 5; i++ {
		times = append(times, consoleAt.Add(-time.Duration(i)*time.Minute)) // the last interval
	}
	times = append(times, consoleAt.Add(-23*time.Hour-30*time.Minute), consoleAt.Add(-48*time.Hour)) // the first; outside
	tl := w.timeline(times, 24, 96, 24)
	if tl.Total != 6 || len(tl.Bars) != 2 {
		t.Fatalf("timeline: %d arrivals in %d bars, want 6 in 2: %+v", tl.Total, len(tl.Bars), tl.Bars)
	}
	first, last := tl.Bars[0], tl.Bars[1]
	if first.X != 0 || last.X != 92 || last.H != 23 || first.H >= last.H || first.H < 2 || last.Y+last.H != 23 {
		t.Errorf("bars %+v, %+v", first, last)
	}
	if want := "6 arrival(s) from 2025-03-03 12:00:00Z to 2025-03-04 12:00:00Z; at most 5 in one 1h interval"; tl.Label != want {
		t.Errorf("label %q, want %q", tl.Label, want)
	}
	// A window of one instant is widened, not divided by zero.
	if tl := (window{From: consoleAt, To: consoleAt}).fit().timeline([]time.Time{consoleAt}, 24, 96, 24); tl.Total != 1 {
		t.Errorf("one-instant window: %+v", tl)
	}
	srv, _ := fakeConsole(t, "")
	_, body := overviewGroups(t, srv, "")
	if n := strings.Count(body, `<svg class="timeline"`); n != 3 {
		t.Errorf("%d timelines on the overview, want 3", n)
	}
	if !strings.Contains(body, `role="img" aria-label="4 arrival(s) from`) {
		t.Error("the schema group's timeline does not say its 4 arrivals in words")
	}
}

// A JSON payload is indented two spaces a level, strings untouched; what
// is not JSON, or would grow past the cap, is not.
func TestPrettyJSON(t *testing.T) {
	t.Parallel()
	got, ok := prettyJSON([]byte(` {"a":[1, 2,{}],"b":{"c":"x, {y}: \"z\""},"e":[]} `))
	want := "{\n  \"a\": [\n    1,\n    2,\n    {}\n  ],\n  \"b\": {\n    \"c\": \"x, {y}: \\\"z\\\"\"\n  },\n  \"e\": []\n}"
	if !ok || got != want {
		t.Errorf("prettyJSON:\n%s\nwant\n%s", got, want)
	}
	var back any
	if err := json.Unmarshal([]byte(got), &back); err != nil {
		t.Errorf("the indented text is not JSON: %v", err)
	}
	for _, in := range []string{`{"a":`, `not json`, `{"a":1} {"b":2}`, strings.Repeat("[", 5000) + strings.Repeat("]", 5000)} {
		if out, ok := prettyJSON([]byte(in)); ok {
			t.Errorf("prettyJSON(%.20q) = %d bytes, want a refusal", in, len(out))
		}
	}
}

// The audit page lists the newest events first, a page at a time, and
// filters by queue, kind and run.
func TestAuditPageNewestFirstAndBounded(t *testing.T) {
	t.Parallel()
	srv, _ := fakeConsole(t, "")
	runs := func(body string) []string {
		var out []string
		for _, m := range regexp.MustCompile(`href="/quarantine/audit\?run=(run-\d+)"`).FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	code, body := get(t, srv.URL+"/quarantine/audit")
	got := runs(body)
	if code != http.StatusOK || len(got) != auditPage || got[0] != "run-149" || got[auditPage-1] != "run-050" || !strings.Contains(body, `href="/quarantine/audit?offset=100" id="older"`) {
		t.Fatalf("audit page: %d, %d rows from %v", code, len(got), got[:min(len(got), 2)])
	}
	_, body = get(t, srv.URL+"/quarantine/audit?offset=100")
	if got = runs(body); len(got) != 50 || got[0] != "run-049" || strings.Contains(body, `id="older"`) || !strings.Contains(body, `id="newer"`) {
		t.Errorf("older page: %d rows from %v", len(got), got[:min(len(got), 1)])
	}
	_, body = get(t, srv.URL+"/quarantine/audit?run=run-007")
	if got = runs(body); len(got) != 1 || !strings.Contains(body, "web:op7") {
		t.Errorf("one run: %v", got)
	}
	if _, body = get(t, srv.URL+"/quarantine/audit?queue=billing"); !strings.Contains(body, `id="no-events"`) {
		t.Error("billing's audit lists orders' events")
	}
	if code, body = get(t, srv.URL+"/quarantine/audit?kind=deleted"); code != http.StatusBadRequest || !strings.Contains(body, "kind: &#34;deleted&#34; is not one of") {
		t.Errorf("unknown kind: %d", code)
	}
}

// A refused action says exactly why: no token configured, none given,
// or a wrong one; and the page that says so is not "read-only" when a
// token is configured.
func TestPageSaysWhyAnActionIsRefused(t *testing.T) {
	t.Parallel()
	ro, _ := fakeConsole(t, "")
	rw, _ := fakeConsole(t, "0123456789abcdef-operator")
	sel := url.Values{"queue": {"orders"}, "class": {"schema"}, "fingerprint": {"fp-schema"}}
	with := func(k, v string) url.Values {
		out := url.Values{}
		for key, vs := range sel {
			out[key] = vs
		}
		out.Set(k, v)
		return out
	}
	for _, c := range []struct {
		name string
		srv  *httptest.Server
		form url.Values
		want string
	}{
		{"read-only page", ro, with("token", "0123456789abcdef-operator"), "read-only: no operator token is configured"},
		{"no token given", rw, sel, "no operator token given"},
		{"wrong token", rw, with("token", "0123456789abcdef-operatoR"), "wrong operator token"},
		{"unknown confirmation", rw, with("confirmation", "00112233445566778899aabbccddeeff"), "this confirmation is unknown"},
	} {
		code, body := post(t, c.srv.URL+"/quarantine/replay", c.form)
		msg := regexp.MustCompile(`<p class="error" id="error">([^<]*)</p>`).FindStringSubmatch(body)
		if code != http.StatusForbidden || msg == nil || !strings.Contains(msg[1], c.want) {
			t.Errorf("%s: %d %q, want 403 saying %q", c.name, code, msg, c.want)
			continue
		}
		if c.srv == rw && (strings.Contains(body, "read-only") || !strings.Contains(body, `id="actions-enabled"`)) {
			t.Errorf("%s: the refusal on a page with a token says read-only:\n%s", c.name, body)
		}
	}
	// A ticked id that is no record of the group this action can take (of
	// another group, or replayed) is named and left out; with nothing left
	// the dry run offers no confirmation.
	form0 := with("token", "0123456789abcdef-operator")
	form0["id"] = []string{"bbbb00000001", "aaaa00000004"}
	code, body := post(t, rw.URL+"/quarantine/replay", form0)
	if code != http.StatusOK || !strings.Contains(body, `id="dropped">2 ticked record(s) are not ones this replay can take`) ||
		!strings.Contains(body, "<code>bbbb00000001</code>, <code>aaaa00000004</code>") || strings.Contains(body, `name="confirmation"`) {
		t.Errorf("ticked records of another group: %d\n%s", code, body)
	}
	// Ticking nothing while choosing "the ticked records" is named too.
	form := with("token", "0123456789abcdef-operator")
	form.Set("scope", "picked")
	if code, body := post(t, rw.URL+"/quarantine/replay", form); code != http.StatusBadRequest || !strings.Contains(body, "no records ticked") {
		t.Errorf("nothing ticked: %d\n%s", code, body)
	}
}

// benchConsole is a page over a fake snapshot of n open records in groups
// groups of one queue (payload-free, as the page reads them).
func benchConsole(b testing.TB, n, groups int) http.Handler {
	snap := &quarantine.Snapshot{At: consoleAt, Intake: map[string]int{}}
	for i := 0; i < n; i++ {
		g := i % groups
		snap.Records = append(snap.Records, fakeRecord(fmt.Sprintf("%012x", i), "orders", "permanent", fmt.Sprintf("fp-%04d", g),
			fmt.Sprintf("422 Unprocessable Entity: rule %d refused the order (customer c-%d)", g, i), time.Duration(i%(7*24*60))*time.Minute,
			quarantine.StateOpen, "payments"))
	}
	cfg := &config.Config{Queues: []config.Queue{{Name: "orders", Owner: config.Owner{Team: "payments"}, Quarantine: config.Quarantine{Queue: "orders.quarantine"}}}}
	p := &Page{Config: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AllowedHosts: []string{"page.example"},
		Dial: func() (*amqp.Connection, error) { return nil, errors.New("no broker") },
		read: func(context.Context) (*quarantine.Snapshot, error) { return snap, nil }}
	return p.Handler()
}

func benchGet(b *testing.B, h http.Handler, target string) {
	var size int
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://page.example"+target, nil))
		if rec.Code != http.StatusOK {
			b.Fatalf("%s: %d", target, rec.Code)
		}
		size = rec.Body.Len()
	}
	b.ReportMetric(float64(size), "page-bytes")
}

// What one overview or group page costs the sidecar over a large
// quarantine (figures in docs/performance.md).
func BenchmarkConsole(b *testing.B) {
	for _, c := range []struct{ n, groups int }{{10_000, 100}, {100_000, 1000}} {
		h := benchConsole(b, c.n, c.groups)
		b.Run(fmt.Sprintf("overview/%d-records-%d-groups", c.n, c.groups), func(b *testing.B) { benchGet(b, h, "/quarantine") })
		b.Run(fmt.Sprintf("filtered/%d-records-%d-groups", c.n, c.groups), func(b *testing.B) { benchGet(b, h, "/quarantine?last=24h&text=customer+c-1") })
		b.Run(fmt.Sprintf("group/%d-records-%d-groups", c.n, c.groups), func(b *testing.B) {
			benchGet(b, h, "/quarantine/group?"+groupQuery("orders", "permanent", "fp-0001").Encode())
		})
	}
}

// However many groups match, the overview lists pageGroups of them, in
// its order, and says how many it left out; the totals count them all.
func TestOverviewListsABoundedNumberOfGroups(t *testing.T) {
	t.Parallel()
	h := benchConsole(t, 3*pageGroups, pageGroups+50)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://page.example/quarantine?sort=age", nil))
	body := rec.Body.String()
	if n := len(groupRowRE.FindAllString(body, -1)); rec.Code != http.StatusOK || n != pageGroups {
		t.Fatalf("%d: %d groups listed, want %d", rec.Code, n, pageGroups)
	}
	if !strings.Contains(body, fmt.Sprintf("The first %d of %d groups in this order are listed", pageGroups, pageGroups+50)) ||
		!strings.Contains(body, fmt.Sprintf(`id="total-open">%d</strong>`, 3*pageGroups)) {
		t.Error("the overview does not say it left groups out, or its totals are the listed groups'")
	}
}

// The audit trail says of each event what `quarantine audit` says in its
// SIGNED column: signed (verified), counted but not verified ("?"), or
// unsigned and ignored (a forgery, say, written into the events stream
// after signing began): a forged event must not read like an operator's.
func TestAuditPageMarksUnsignedEvents(t *testing.T) {
	t.Parallel()
	srv, snap := fakeConsole(t, "")
	at := consoleAt.Add(-time.Minute)
	snap.Events = append(snap.Events,
		quarantine.Event{Kind: quarantine.EventPurged, At: at, By: "alice@ops-host", Run: "run-signed", Quarantine: "orders.quarantine", Verified: true},
		quarantine.Event{Kind: quarantine.EventPurged, At: at, By: "bob@ops-host", Run: "run-counted", Quarantine: "orders.quarantine",
			Unverified: "no signing key to check it with"},
		quarantine.Event{Kind: quarantine.EventPurged, At: at, By: "alice@ops-host", Run: "run-forged", Quarantine: "orders.quarantine",
			Ignored: true, Unverified: "unsigned, after the stream's first signed event: ignored"})
	_, body := get(t, srv.URL+"/quarantine/audit")
	row := func(run string) string {
		for _, r := range strings.Split(body, `<tr class="event">`)[1:] {
			if r, _, _ = strings.Cut(r, "</tr>"); strings.Contains(r, "run="+run+`"`) {
				return r
			}
		}
		t.Fatalf("no row for %s", run)
		return ""
	}
	for run, want := range map[string]string{
		"run-signed":  `<td class="signed verified">signed</td>`,
		"run-counted": `<td class="signed unverified" title="no signing key to check it with">not verified ?</td>`,
		"run-forged":  `<td class="signed ignored" title="unsigned, after the stream&#39;s first signed event: ignored">UNSIGNED: ignored</td>`,
	} {
		if r := row(run); !strings.Contains(r, want) {
			t.Errorf("%s's row does not say %s:\n%s", run, want, r)
		}
	}
	if !strings.Contains(body, `<th scope="col">Signed</th>`) {
		t.Error("the events table has no Signed column")
	}
}

// A window of any length bins its arrivals, however long ago it starts:
// the bin's index was an int64 product that wrapped for windows over about
// 12 years (a "since" of 1909 panicked the handler, a stack trace in the
// log for anyone's GET).
func TestTimelineOfAnyWindow(t *testing.T) {
	t.Parallel()
	for _, from := range []time.Time{time.Date(1909, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC), consoleAt.AddDate(-13, 0, 0)} {
		for _, to := range []time.Time{consoleAt, time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)} {
			tl := (window{From: from, To: to}).fit().timeline([]time.Time{from, consoleAt.Add(-time.Hour), to}, overviewBins, 96, 24)
			if tl.Total != 3 || len(tl.Bars) < 2 || tl.Bars[0].X != 0 || tl.Bars[len(tl.Bars)-1].X != (overviewBins-1)*(96/overviewBins) {
				t.Errorf("%s to %s: %+v", from, to, tl)
			}
		}
	}
	srv, _ := fakeConsole(t, "")
	for y := 1900; y < 2025; y += 3 {
		if code, _ := get(t, fmt.Sprintf("%s/quarantine?since=%04d-01-01T00:00:00", srv.URL, y)); code != http.StatusOK {
			t.Errorf("since %d: %d", y, code)
		}
	}
}

// Everything a producer, a handler or a writer of the events stream can
// put into a record or an event reaches the console's views as text: the
// group list, the overview's error and filters, the audit trail's by,
// reason, filter, repair and counts, the filter fields typed back.
func TestConsoleEscapesHostileFields(t *testing.T) {
	t.Parallel()
	const evil = `"><script>alert(1)</script><img src=x onerror=alert(2)><svg onload=alert(3)>`
	srv, snap := fakeConsole(t, "0123456789abcdef-operator")
	r := fakeRecord("dddd00000001", "orders", "permanent", "fp-evil"+evil, "boom "+evil, time.Minute, quarantine.StateOpen, "payments"+evil)
	r.Properties.MessageID = "m" + evil
	r.Envelope.Reason = "reason " + evil
	snap.Records = append(snap.Records, r)
	snap.Events = append(snap.Events, quarantine.Event{Kind: quarantine.EventPurged, At: consoleAt, By: "web:" + evil, Run: "run" + evil,
		Reason: evil, Filter: "queue=" + evil, Patch: evil, Quarantine: "orders.quarantine" + evil, IDs: []string{"id" + evil},
		Counts: map[string]int{evil: 1}, Unverified: evil})
	group := "/quarantine/group?" + groupQuery("orders", "permanent", "fp-evil"+evil).Encode()
	for _, path := range []string{"/quarantine", "/quarantine?text=" + url.QueryEscape(evil) + "&owner=" + url.QueryEscape("payments"+evil),
		group, "/quarantine/audit", "/quarantine/audit?run=" + url.QueryEscape("run"+evil)} {
		code, body := get(t, srv.URL+path)
		if code != http.StatusOK {
			t.Errorf("%s: %d", path, code)
			continue
		}
		for _, raw := range []string{"<script", "<img", "<svg onload"} {
			if strings.Contains(body, raw) {
				i := strings.Index(body, raw)
				t.Errorf("%s: %q unescaped: …%s…", path, raw, body[max(0, i-80):min(len(body), i+80)])
			}
		}
	}
}
