package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/quarantine"
)

// tableRecords are records as a demo's quarantine holds them: long queue
// names, long errors, two schema groups that differ only in their error.
func tableRecords(now time.Time) []*quarantine.Record {
	long := "additionalProperties 'amountCents' not allowed; " + strings.Repeat("and a very long explanation ", 8)
	return []*quarantine.Record{
		{ID: "a1b2c3d4e5f6", Queue: "orders-service-primary-work", State: quarantine.StateOpen, StoredAt: now.Add(-3 * time.Hour),
			Envelope:   quarantine.Envelope{Class: "permanent", Fingerprint: "0123456789abcdef", Reason: "permanent failure", Error: "422 Unprocessable Entity: customer is flagged bad"},
			Properties: quarantine.Properties{MessageID: "order-7f3e9c2a-0000-4b6e-9d2f-1234567890ab"}},
		{ID: "b1b2c3d4e5f6", Queue: "orders", State: quarantine.StateOpen, StoredAt: now.Add(-time.Minute),
			Envelope:   quarantine.Envelope{Class: "schema", Fingerprint: "fedcba9876543210", Reason: "schema failure", Error: long},
			Properties: quarantine.Properties{MessageID: "m-2"}},
		{ID: "c1b2c3d4e5f6", Queue: "orders", State: quarantine.StateOpen, StoredAt: now.Add(-time.Minute),
			Envelope: quarantine.Envelope{Class: "schema", Fingerprint: "1111111111111111", Reason: "schema failure"}},
	}
}

func widest(t *testing.T, out string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(out, "\n") {
		n = max(n, utf8.RuneCountInString(line))
	}
	return n
}

// By default every table fits 100 columns and still says what went wrong
// (the error, not the class restated) and which message it was; --wide
// shows every column uncut.
func TestTablesFitATerminal(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	recs := tableRecords(now)
	snap := &quarantine.Snapshot{At: now}
	groups := []quarantine.Group{
		{Queue: "orders-service-primary-work", Class: "schema", Fingerprint: "fedcba9876543210", Open: 12, LastSeen: now, FirstSeen: now.Add(-time.Hour),
			Example: "additionalProperties 'amountCents' not allowed", OldestOpenAge: quarantine.Seconds(time.Hour)},
		{Queue: "orders", Class: "schema", Fingerprint: "1111111111111111", Open: 1, LastSeen: now, FirstSeen: now,
			Example: "missing properties: 'customer'"},
	}
	events := []quarantine.Event{{At: now, Quarantine: "orders-service-primary-work.quarantine", Kind: "replay-finished", By: "alice@ops-host.example.internal",
		Run: "r-0123456789", Reason: "fixed in 1.2.4 after the inventory outage of this morning, see the incident channel",
		Filter: "fingerprint=fedcba9876543210", Counts: map[string]int{"sent": 12, "refused": 0}, IDs: []string{"a1b2c3d4e5f6", "b1b2c3d4e5f6"}}}

	for _, wide := range []bool{false, true} {
		var list, stats, audit bytes.Buffer
		if err := writeList(&list, recs, len(recs), now, wide); err != nil {
			t.Fatal(err)
		}
		if err := writeStats(&stats, groups, snap, wide); err != nil {
			t.Fatal(err)
		}
		if err := writeAudit(&audit, events, wide, true, "DLXBRIDGE_SIGNING_KEY"); err != nil {
			t.Fatal(err)
		}
		for name, out := range map[string]string{"list": list.String(), "stats": stats.String(), "audit": audit.String()} {
			if w := widest(t, out); !wide && w > tableWidth {
				t.Errorf("%s is %d columns wide, want at most %d:\n%s", name, w, tableWidth, out)
			} else if wide && w <= tableWidth {
				t.Errorf("%s --wide is %d columns: is it cut?\n%s", name, w, out)
			}
		}
		l := list.String()
		for _, want := range []string{"MESSAGE ID", "ERROR", "422 Unprocessable Entity", "a1b2c3d4e5f6", "additionalProperties 'amountCents'", "schema failure"} {
			if !strings.Contains(l, want) {
				t.Errorf("list (wide %v) lacks %q:\n%s", wide, want, l)
			}
		}
		if wide && !strings.Contains(l, "order-7f3e9c2a-0000-4b6e-9d2f-1234567890ab") {
			t.Errorf("list --wide cuts the message id:\n%s", l)
		}
		if !wide && !strings.Contains(l, "order-7f3e9c2a-…") {
			t.Errorf("list does not show the start of a long message id:\n%s", l)
		}
		s := stats.String()
		for _, want := range []string{"additionalProperties 'amountCents' not", "missing properties"} {
			if !strings.Contains(s, want) {
				t.Errorf("stats (wide %v) EXAMPLE lacks the error %q:\n%s", wide, want, s)
			}
		}
		if a := audit.String(); !strings.Contains(a, "alice@ops-host") || !strings.Contains(a, "fixed in 1.2.4") {
			t.Errorf("audit (wide %v) lacks who or why:\n%s", wide, a)
		}
	}
}

// show indents a JSON payload (it stays a faithful copy: only whitespace
// is added) unless --raw, and never indents what is not JSON.
func TestShowIndentsJSONPayloads(t *testing.T) {
	t.Parallel()
	now := time.Now()
	r := tableRecords(now)[0]
	r.Body = []byte(`{"id":"o-1","customer":{"name":"bad"},"lines":[1,2]}`)
	var out bytes.Buffer
	if err := writeRecord(&out, r, nil, now, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "{\n  \"id\": \"o-1\",\n  \"customer\": {\n    \"name\": \"bad\"\n  },") {
		t.Errorf("payload not indented:\n%s", out.String())
	}
	out.Reset()
	if err := writeRecord(&out, r, nil, now, true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), string(r.Body)) || strings.Contains(out.String(), "indented") {
		t.Errorf("--raw changed the payload:\n%s", out.String())
	}
	r.Body = []byte("not json {\x1b[2J")
	out.Reset()
	if err := writeRecord(&out, r, nil, now, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "indented") || strings.Contains(out.String(), "\x1b") {
		t.Errorf("a non-JSON payload was indented or printed unescaped:\n%s", out.String())
	}
}

// show's rows fit 100 columns: long values wrap under their column, a
// long header name stands on its own line, and nothing of a value is lost.
func TestShowFitsATerminal(t *testing.T) {
	t.Parallel()
	now := time.Now()
	r := tableRecords(now)[1]
	r.Envelope.Notes = []string{strings.Repeat("a note that runs on and on ", 10)}
	r.Body = []byte(`{}`)
	var out bytes.Buffer
	if err := writeRecord(&out, r, nil, now, false); err != nil {
		t.Fatal(err)
	}
	if w := widest(t, out.String()); w > tableWidth {
		t.Errorf("show is %d columns wide:\n%s", w, out.String())
	}
	flat := strings.Join(strings.Fields(out.String()), " ")
	if !strings.Contains(flat, strings.TrimSpace(strings.Repeat("a note that runs on and on ", 10))) {
		t.Errorf("a wrapped note lost text:\n%s", out.String())
	}
	for _, tc := range []struct {
		s     string
		width int
	}{{"", 5}, {"abc", 5}, {"abcdefghij", 4}, {"ab  cd ef", 4}, {"a b c d e f g", 3}} {
		lines := cutLines(tc.s, tc.width)
		for _, l := range lines {
			if utf8.RuneCountInString(l) > tc.width {
				t.Errorf("cutLines(%q, %d) = %q: a line is too long", tc.s, tc.width, lines)
			}
		}
		if j := strings.Join(lines, ""); strings.ReplaceAll(j, " ", "") != strings.ReplaceAll(tc.s, " ", "") {
			t.Errorf("cutLines(%q, %d) = %q lost characters", tc.s, tc.width, lines)
		}
	}
}

// A "?" in list's CLASS or STATE is explained under the table, as jobs
// explains its own: an operator without the signing key sees one on every
// record the runtime wrote. A list with none says nothing more.
func TestListExplainsItsQuestionMark(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	recs := tableRecords(now)
	var plain bytes.Buffer
	if err := writeList(&plain, recs, len(recs), now, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain.String(), "?:") {
		t.Errorf("list without a mark explains one:\n%s", plain.String())
	}
	recs[0].Envelope.Source = quarantine.SourceBridge // claims the bridge wrote it, not verified
	var marked bytes.Buffer
	if err := writeList(&marked, recs, len(recs), now, false); err != nil {
		t.Fatal(err)
	}
	if out := marked.String(); !strings.Contains(out, "permanent?") || !strings.Contains(out, "\n?: a class or state marked so was not verified") {
		t.Errorf("list does not explain its \"?\":\n%s", out)
	}
}
