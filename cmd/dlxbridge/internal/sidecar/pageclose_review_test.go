package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"

	"github.com/dlxbridge/dlxbridge/quarantine"
)

// A replay confirmed on the page runs on in the background; when the
// runtime shuts down (SIGTERM: dlxbridge run closes the page), it stops
// after the message in flight and writes its end before Close returns, so
// that what it sent is marked replayed and its job reads stopped, not
// "its process ended". Before, nothing stopped it: the process exited
// under it mid-send, and a message confirmed but not yet marked was sent
// again by the next replay.
func TestPageCloseStopsABackgroundReplayCleanly(t *testing.T) {
	t.Parallel()
	b := setupPage(t)
	p, srv, job := startSlowReplay(t, b)
	t.Cleanup(p.Close)
	srv.Close()
	p.Close()

	conn := b.env.Dial("check")
	in := &quarantine.Inspector{Conn: conn, Config: b.cfg}
	jobs, err := in.Jobs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	j, err := quarantine.FindJob(jobs, job)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != quarantine.JobStopped || j.Finished.IsZero() || !strings.Contains(j.Stop, "shut") {
		t.Errorf("after Close the job is %s (finished %v, stop %q); want stopped by the shutdown, its end written", j.State, j.Finished, j.Stop)
	}
	open, replayed, _ := openIn(b.snapshot(), "fp-a")
	if replayed != j.Sent || open+replayed != slowReplayRecords || open == 0 {
		t.Errorf("after Close: %d replayed, %d open, job sent %d; want every sent record marked, the rest open", replayed, open, j.Sent)
	}
}

// confirmSlowReplay confirms on the page at base a
// replay of b's records of fp-a at 1/s, which takes longer than the page
// waits, and returns its job, running in the background.
func confirmSlowReplay(t *testing.T, b *pageBundle, base string) string {
	t.Helper()
	sel := url.Values{"queue": {b.q.Name}, "class": {"permanent"}, "fingerprint": {"fp-a"}, "token": {"s3cret"}, "rate": {"1"}}
	code, body := post(t, base+"/quarantine/replay", sel)
	confirmation := regexp.MustCompile(`name="confirmation" value="([^"]+)"`).FindStringSubmatch(body)
	if code != http.StatusOK || !strings.Contains(body, `id="confirm"`) || confirmation == nil {
		t.Fatalf("dry run: %d\n%s", code, body)
	}
	// At 1/s 8 records take 7 s: the answer comes after 3.
	code, body = post(t, base+"/quarantine/replay", url.Values{"confirmation": {confirmation[1]}, "confirm": {"1"}})
	m := regexp.MustCompile(`id="job" href="/quarantine/jobs\?id=([0-9a-f]+)"`).FindStringSubmatch(body)
	if code != http.StatusOK || m == nil || !strings.Contains(body, "in the background") {
		t.Fatalf("confirm: %d\n%s", code, body)
	}
	return m[1]
}

// During a resource alarm the broker answers nothing on a connection that
// publishes: a background replay waits for a confirm that does not come
// before the alarm clears. Close still returns (it closes the replay's
// connection after pageCloseWait), so that the runtime's shutdown does not
// wait for the alarm.
func TestPageCloseReturnsDuringAnAlarm(t *testing.T) {
	if testing.Short() {
		t.Skip("resource alarm on a private broker node: skipped in -short")
	}
	node := brokertest.StartPrivateNode(t)
	b := setupPageQueuesOn(t, node.Env(t), pageQueue{Name: "work"})
	p, _, _ := startSlowReplay(t, b)
	node.RaiseMemoryAlarm()
	t.Cleanup(node.ClearMemoryAlarm)
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(pageCloseWait + 20*time.Second):
		t.Fatal("Close did not return during the alarm")
	}
}

// startSlowReplay quarantines slowReplayRecords records of fp-a in b, serves a page with
// the operator token, and confirms there a replay of them at 1/s: it runs
// on in the background as job.
func startSlowReplay(t *testing.T, b *pageBundle) (p *Page, srv *httptest.Server, job string) {
	t.Helper()
	b.quarantine(slowReplayRecords, "fp-a", "failed fp-a", func(i int) string { return fmt.Sprintf(`{"id":"a-%d"}`, i) }, nil)
	b.keep(slowReplayRecords)
	p = &Page{Config: b.cfg, Registry: b.reg, Token: "s3cret",
		Dial: func() (*amqp.Connection, error) { return b.env.Dial("page"), nil }}
	srv = httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return p, srv, confirmSlowReplay(t, b, srv.URL)
}

// slowReplayRecords is how many records startSlowReplay replays.
const slowReplayRecords = 8
