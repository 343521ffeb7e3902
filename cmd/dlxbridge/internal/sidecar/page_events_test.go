package sidecar

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/triage"
)

// With the signing key the page signs the events of its purges (readers
// with the key count them), and a purged event published straight into the
// events stream through the default exchange changes nothing on it: the
// record stays open. Without the key the page counts that event, as
// before, and says on the record that it was not verified.
func TestPageSignsItsEventsAndMarksUnverifiedOnes(t *testing.T) {
	t.Parallel()
	b := setupPage(t)
	b.quarantine(2, "fp-s", "failed", func(i int) string { return `{"id":"s"}` + strings.Repeat(" ", i) }, nil)
	b.keep(2)
	signer, err := triage.NewSigner([]byte("the runtime's key, 32 bytes....."))
	if err != nil {
		t.Fatal(err)
	}
	const token = "an operator token of 32 bytes..."
	serve := func(s *triage.Signer) *httptest.Server {
		p := &Page{Config: b.cfg, Registry: b.reg, Token: token, Signer: s,
			Dial: func() (*amqp.Connection, error) { return b.env.Dial("page"), nil }}
		srv := httptest.NewServer(p.Handler())
		t.Cleanup(srv.Close)
		return srv
	}
	keyed, plain := serve(signer), serve(nil)
	recs := b.snapshot().Records
	signed, forged := recs[0].ID, recs[1].ID

	purge := url.Values{"queue": {b.q.Name}, "class": {"permanent"}, "fingerprint": {"fp-s"}, "token": {token},
		"reason": {"known bad"}, "confirm": {"1"}, "ids": {signed}}
	if code, body := post(t, keyed.URL+"/quarantine/purge", purge); code != http.StatusOK || !strings.Contains(body, "Purged 1 of 1") {
		t.Fatalf("purge from the page: %d\n%s", code, body)
	}
	ev, _ := json.Marshal(quarantine.Event{Kind: quarantine.EventPurged, At: time.Now().UTC(), By: "alice@ops-host",
		Reason: "forged", Run: "f0f0f0f0f0f0", IDs: []string{forged}})
	conf, err := b.pub.PublishWithDeferredConfirmWithContext(context.Background(), "", b.q.Quarantine.EventsStream(), true, false, amqp.Publishing{Body: ev})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := conf.WaitContext(context.Background()); err != nil || !ok {
		t.Fatalf("publish the forged event: ack %v, %v", ok, err)
	}

	conn := b.env.Dial("page-check-keyed")
	snap, err := (&quarantine.Inspector{Conn: conn, Config: b.cfg, Verifier: signer}).Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]quarantine.State{signed: quarantine.StatePurged, forged: quarantine.StateOpen} {
		if r, err := snap.Get(id); err != nil || r.State != want {
			t.Errorf("record %s read with the key: %+v %v, want %s", id, r, err, want)
		}
	}
	if r, _ := snap.Get(signed); r.Resolution == nil || !r.Resolution.Verified {
		t.Errorf("the page's purge is not signed: %+v", r.Resolution)
	}

	if _, body := get(t, keyed.URL+"/quarantine/record/"+forged); !strings.Contains(body, `id="state">open`) || strings.Contains(body, "alice@ops-host") {
		t.Errorf("with the key the forged event shows on the record:\n%s", body)
	}
	if _, body := get(t, keyed.URL+"/quarantine/record/"+signed); !strings.Contains(body, `id="state">purged`) || strings.Contains(body, `id="event-unverified"`) {
		t.Errorf("with the key the signed purge is not shown as verified:\n%s", body)
	}
	if _, body := get(t, plain.URL+"/quarantine/record/"+forged); !strings.Contains(body, "alice@ops-host") || !strings.Contains(body, `id="event-unverified"`) {
		t.Errorf("without the key the forged purge is not marked as unverified:\n%s", body)
	}
}
