package sidecar

import (
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/quarantine"
)

// The console's seeded quarantine: what widens a table (an error that is
// one long word, long message ids, long queue names), a message
// quarantined twice (a history), groups at different ages, two queues
// with their owners.
const (
	fpLong    = "fp-long"
	fpFlagged = "fp-flagged"
	fpCard    = "fp-card"
)

var (
	ownerPayments = config.Owner{Team: "payments", Contact: "#payments-oncall"}
	ownerBilling  = config.Owner{Team: "billing", Contact: "billing-oncall@example.com"}
	longError     = "POST https://inventory.internal.example/api/v2/reservations?order=" + strings.Repeat("9f3c2a71", 30) + " answered 500"
)

func seedConsole(b *pageBundle) {
	b.t.Helper()
	orders, billing := &b.cfg.Queues[0], &b.cfg.Queues[1]
	b.seed(orders, seedSpec{N: 4, Fingerprint: fpLong, Class: "transient", Reason: "retries exhausted", Error: longError,
		Body:      func(i int) string { return fmt.Sprintf(`{"id":"long-%d"}`, i) },
		MessageID: func(i int) string { return fmt.Sprintf("order-%d-%s", i, strings.Repeat("0123456789abcdef", 4)) },
		Ago:       func(i int) time.Duration { return time.Duration(4-i) * 25 * time.Minute }})
	b.seed(orders, seedSpec{N: 2, Fingerprint: fpFlagged, Error: "422 Unprocessable Entity: customer is flagged bad",
		Body: func(i int) string {
			return fmt.Sprintf(`{"id":"order-17","attempt":%d,"customer":{"id":"c-9","flags":["bad"]}}`, i)
		},
		MessageID: func(int) string { return "order-17" },
		Ago:       func(i int) time.Duration { return time.Duration(2-i) * 90 * time.Minute }})
	b.seed(billing, seedSpec{N: 1, Fingerprint: fpCard, Class: "schema", Reason: "schema test.job v1", Error: "additionalProperties 'amountCents' not allowed",
		Body: func(int) string { return `{"id":"inv-1","amountCents":1200}` },
		Ago:  func(int) time.Duration { return 26 * time.Hour }})
	b.keep(7)
}

// idsOf are the ids of the records of fingerprint fp, in stream order.
func idsOf(s *quarantine.Snapshot, fp string) []string {
	var out []string
	for _, r := range s.Records {
		if r.Envelope.Fingerprint == fp {
			out = append(out, r.ID)
		}
	}
	return out
}

// In a real browser at 1280 × 900, every view of the console loads with
// seeded records, fits the width, passes axe-core without a serious or
// critical violation, and the browser reports no CSP refusal; the
// filters live in the URL and survive a round trip through a group; a
// replay of some of a group's records moves exactly those.
func TestBrowserConsole(t *testing.T) {
	t.Parallel()
	br := startBrowser(t)
	axeSource(t)
	b := setupPageQueues(t, pageQueue{"orders", ownerPayments}, pageQueue{"billing", ownerBilling})
	seedConsole(b)
	const token = "0123456789abcdef-operator"
	srv := b.server(token)
	check := func(what string) {
		t.Helper()
		br.fitsWidth(what)
		br.checkAccessible(what)
		if errs := br.consoleErrors(); len(errs) > 0 {
			t.Errorf("%s: the browser reports: %q", what, errs)
		}
	}
	shown := func() []string {
		var fps []string
		for _, id := range br.all("tr.group") {
			var fp string
			br.execute(`return arguments[0].dataset.fingerprint`, &fp, map[string]string{webElementKey: id})
			fps = append(fps, fp)
		}
		return fps
	}

	br.open(srv.URL + "/quarantine")
	if got := shown(); len(got) != 3 {
		t.Fatalf("overview lists %v, want the 3 groups", got)
	}
	if got := br.text("#total-open"); got != "7" {
		t.Errorf("total open %q, want 7", got)
	}
	if got := br.text(`tr.group[data-fingerprint="` + fpFlagged + `"] a.group-link`); got != "422 Unprocessable Entity: customer is flagged bad" {
		t.Errorf("the flagged group says %q, not its error", got)
	}
	// The timelines render (CSP allows inline SVG): bars with a size.
	var bars struct{ Rects, Width int }
	br.execute(`const s = document.querySelector('tr.group[data-fingerprint="`+fpLong+`"] svg.timeline');
		return {Rects: s.querySelectorAll("rect").length, Width: Math.round(s.getBoundingClientRect().width)}`, &bars)
	if bars.Rects == 0 || bars.Width < 50 {
		t.Errorf("the long group's timeline: %d bars, %d px wide", bars.Rects, bars.Width)
	}
	check("overview")
	// What WebDriver runs is not under the page's CSP (axe-core just ran),
	// while a script the page itself holds is refused, and the refusal
	// shows in the console check uses.
	var ran struct{ Injected, Inline bool }
	br.execute(`const s = document.createElement("script"); s.textContent = "window.inlineRan = true";
		document.head.appendChild(s); return {Injected: true, Inline: window.inlineRan === true}`, &ran)
	if !ran.Injected || ran.Inline {
		t.Errorf("under the page's CSP: WebDriver's script ran %v, the page's inline script ran %v; want true, false", ran.Injected, ran.Inline)
	}
	if errs := br.consoleErrors(); len(errs) != 1 || !strings.Contains(errs[0], "Content Security Policy") {
		t.Errorf("the refused inline script is not reported as a CSP refusal: %q", errs)
	}
	// The keyboard reaches a group and opens it.
	br.focus(`tr.group[data-fingerprint="` + fpCard + `"] a.group-link`)
	br.press(keyEnter)
	br.waitText("#fingerprint", fpCard)
	br.open(srv.URL + "/quarantine")

	// Filters: set in the form, carried in the URL, back from a group.
	br.click(`#f-owner option[value="payments"]`)
	br.typeInto("#f-text", "FLAGGED")
	br.click(`#f-sort option[value="last"]`)
	br.click("#apply")
	br.waitText("#total-groups", "1")
	filtered := br.url()
	u, err := url.Parse(filtered)
	if err != nil {
		t.Fatal(err)
	}
	if q := u.Query(); q.Get("owner") != "payments" || q.Get("text") != "FLAGGED" || q.Get("sort") != "last" {
		t.Errorf("the filtered overview's URL %s does not carry the filters", filtered)
	}
	if got := shown(); !slices.Equal(got, []string{fpFlagged}) {
		t.Errorf("filtered overview lists %v, want only %s", got, fpFlagged)
	}
	check("filtered overview")
	br.click("a.group-link")
	if got := br.text("#fingerprint"); got != fpFlagged {
		t.Fatalf("group page for %q", got)
	}
	check("group")
	br.click("#back-overview")
	br.find("#filters")
	if got := br.url(); got != filtered {
		t.Errorf("back from the group: %s, want %s", got, filtered)
	}
	if got := br.property("#f-text", "value"); got != "FLAGGED" {
		t.Errorf("the text filter reads %q after the round trip", got)
	}
	// The link, pasted elsewhere, shows the same.
	br.open(srv.URL + "/quarantine")
	br.open(filtered)
	if got := shown(); !slices.Equal(got, []string{fpFlagged}) {
		t.Errorf("the pasted link lists %v", got)
	}

	// A record: its payload indented (raw on request), its other trip
	// through the quarantine, its way back to the group.
	snap := b.snapshot()
	flagged := idsOf(snap, fpFlagged)
	later, _ := snap.Get(flagged[1])
	br.open(srv.URL + "/quarantine/record/" + later.ID)
	if got := br.text("#payload"); !strings.Contains(got, "\n  \"customer\": {\n    \"id\": \"c-9\",") {
		t.Errorf("the payload is not indented:\n%s", got)
	}
	if rows := br.all("#history tr.history"); len(rows) != 1 || !strings.Contains(br.textOf(rows[0]), flagged[0]) {
		t.Errorf("history: %d rows, want the earlier record %s", len(rows), flagged[0])
	}
	check("record")
	br.click("#raw-link")
	br.waitText("#payload", `{"id":"order-17","attempt":1,"customer":{"id":"c-9","flags":["bad"]}}`)
	check("record, raw payload")
	br.click("#group-link")
	if got := br.text("#fingerprint"); got != fpFlagged {
		t.Errorf("the record's group link leads to %q", got)
	}
	// The record's own purge: a dry run of it alone, then its confirmation.
	br.open(srv.URL + "/quarantine/record/" + later.ID)
	br.typeInto(`#record-form input[name="token"]`, token)
	br.typeInto(`#record-form input[name="reason"]`, "customer stays flagged")
	br.click("#record-purge-dry-run")
	br.waitText("#summary", "Nothing has changed")
	if ids := br.all("#purge-list li.planned"); len(ids) != 1 || br.textOf(ids[0]) != later.ID {
		t.Fatalf("the record's purge plans %d records, want %s alone", len(ids), later.ID)
	}
	check("purge dry run")
	br.click("#confirm")
	br.waitText("#summary", "Purged 1 of 1")
	s := b.snapshot()
	for id, want := range map[string]quarantine.State{later.ID: quarantine.StatePurged, flagged[0]: quarantine.StateOpen} {
		if r, err := s.Get(id); err != nil || r.State != want {
			t.Errorf("after the record's purge, %s: %v %v, want %s", id, r, err, want)
		}
	}

	// Some of a group: tick two of the four; the dry run lists exactly
	// them, and the confirmation moves exactly them.
	long := idsOf(snap, fpLong)
	chosen := []string{long[0], long[2]}
	br.open(srv.URL + "/quarantine/group?" + groupQuery(b.q.Name, "transient", fpLong).Encode())
	check("long group")
	// Ticked from the keyboard: focus, space.
	for _, id := range chosen {
		br.focus("#pick-" + id)
		br.press(keySpace)
		if got := br.property("#pick-"+id, "checked"); got != "true" {
			t.Fatalf("space on %s's checkbox: checked %s", id, got)
		}
	}
	// Tab goes on to that row's record link, in reading order.
	br.press(keyTab)
	var next string
	br.execute(`const a = document.activeElement; return a.className + " " + (a.getAttribute("href") || "")`, &next)
	if want := "record-link mono /quarantine/record/" + chosen[1]; next != want {
		t.Errorf("tab from the last ticked checkbox goes to %q, want %q", next, want)
	}
	br.typeInto("#token", token)
	br.typeInto("#by", "alice")
	br.typeInto(`#act-form input[name="rate"]`, "0")
	br.click("#replay-dry-run")
	br.waitText("#summary", "Nothing has changed")
	var planned []string
	for _, id := range br.all("tr.planned") {
		var rid string
		br.execute(`return arguments[0].dataset.id`, &rid, map[string]string{webElementKey: id})
		planned = append(planned, rid)
	}
	sort.Strings(planned)
	want := slices.Clone(chosen)
	sort.Strings(want)
	if !slices.Equal(planned, want) {
		t.Fatalf("the dry run plans %v, want the ticked %v", planned, want)
	}
	check("dry run")
	br.click("#confirm")
	br.waitText("#summary", "Replayed 2 of 2")
	check("replay result")
	after := b.snapshot()
	bodies := map[string]bool{}
	for _, id := range long {
		r, err := after.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		wantState := quarantine.StateOpen
		if slices.Contains(chosen, id) {
			wantState = quarantine.StateReplayed
			bodies[string(r.Body)] = true
		}
		if r.State != wantState {
			t.Errorf("record %s is %s, want %s", id, r.State, wantState)
		}
	}
	ch := b.env.Channel("console-work")
	for i := 0; i < 2; i++ {
		d, ok, err := ch.Get(b.q.Name, true)
		if err != nil || !ok || !bodies[string(d.Body)] {
			t.Errorf("work queue message %d: %v %v %q, want one of the ticked records' bodies", i, ok, err, d.Body)
		}
	}
	if n := queueDepth(t, b.env, b.q.Name); n != 0 {
		t.Errorf("the work queue holds %d more", n)
	}

	// The audit trail, newest first: the replay just made leads.
	br.open(srv.URL + "/quarantine/audit")
	if got := br.text("tr.event td.kind"); got != quarantine.EventReplayFinished {
		t.Errorf("the newest event is %q, want %s", got, quarantine.EventReplayFinished)
	}
	if got := br.text("tr.event"); !strings.Contains(got, "web:alice") {
		t.Errorf("the newest event does not name the operator: %q", got)
	}
	check("audit trail")
}
