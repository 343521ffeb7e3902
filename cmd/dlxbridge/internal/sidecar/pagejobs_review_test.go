package sidecar

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/quarantine"
)

// The jobs view reads what every listing reads: the shared snapshot, not
// the events streams once per request (anyone may look, and a running job
// makes the page reload itself every few seconds, in every tab). Its
// words from the events (a job id, a reason, a stop) are text, never
// markup.
func TestPageJobsComeFromTheSharedSnapshot(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	const hostile = `"><script>alert(1)</script>`
	ev := func(kind string, s int, mod func(*quarantine.Event)) quarantine.Event {
		e := quarantine.Event{Kind: kind, Run: "feedc0de0001", At: at.Add(time.Duration(s) * time.Second), By: "web:ops",
			Reason: "replayed " + hostile, Verified: true, Quarantine: "orders.quarantine"}
		if mod != nil {
			mod(&e)
		}
		return e
	}
	snap := &quarantine.Snapshot{At: at, Intake: map[string]int{}, Events: []quarantine.Event{
		ev(quarantine.EventClaimed, 0, nil),
		ev(quarantine.EventReplayStarted, 1, func(e *quarantine.Event) { e.Counts = map[string]int{"selected": 2, "to_send": 2} }),
		ev(quarantine.EventReplayed, 2, func(e *quarantine.Event) { e.IDs, e.ToQueue = []string{"aaaa00000001"}, "orders" }),
		ev(quarantine.EventReplayFinished, 3, func(e *quarantine.Event) {
			e.Counts, e.Stop = map[string]int{"selected": 2, "sent": 1, "published": 1, "stopped": 1}, "stopped: "+hostile
		}),
	}}
	var reads, dials atomic.Int32
	p := unreachable("")
	p.Dial = func() (*amqp.Connection, error) {
		dials.Add(1)
		return nil, errors.New("no broker in this test")
	}
	p.limits.maxAge = time.Hour
	p.read = func(context.Context) (*quarantine.Snapshot, error) {
		reads.Add(1)
		return snap, nil
	}
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	for _, path := range []string{"/quarantine/jobs", "/quarantine/jobs", "/quarantine/jobs?id=feedc0de", "/quarantine/jobs?id=feedc0de0001"} {
		code, body := get(t, srv.URL+path)
		if code != http.StatusOK || !strings.Contains(body, "feedc0de0001") {
			t.Fatalf("%s: %d\n%s", path, code, body)
		}
		if strings.Contains(body, "<script>alert") {
			t.Errorf("%s: an event's words rendered as markup", path)
		}
	}
	if r, d := reads.Load(), dials.Load(); r != 1 || d != 0 {
		t.Errorf("four views read the quarantine %d time(s) and dialled %d time(s); want one shared read and no dial (no job runs)", r, d)
	}
}
