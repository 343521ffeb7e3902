package sidecar

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// A replay confirmed on the page is a job: one that takes longer than the
// request waits runs on in the background (the answer links its job), the
// jobs page shows it running with its progress, and the operator token
// cancels it: it stops after the message in flight, the rest stay open.
func TestPageReplayRunsOnAsAJobAndCancels(t *testing.T) {
	t.Parallel()
	b := setupPage(t)
	const n = 8
	b.quarantine(n, "fp-a", "failed fp-a", func(i int) string { return fmt.Sprintf(`{"id":"a-%d"}`, i) }, nil)
	b.keep(n)
	rw := b.server("s3cret")
	job := confirmSlowReplay(t, b, rw.URL)
	if code, body := get(t, rw.URL+"/quarantine/jobs"); code != http.StatusOK || !strings.Contains(body, job) || !strings.Contains(body, "running") {
		t.Fatalf("jobs page: %d\n%s", code, body)
	}
	if code, body := get(t, rw.URL+"/quarantine/jobs?id="+job); code != http.StatusOK || !strings.Contains(body, `id="job-progress"`) || !strings.Contains(body, `id="cancel-form"`) {
		t.Fatalf("job page: %d\n%s", code, body)
	}
	if code, _ := post(t, rw.URL+"/quarantine/jobs/cancel", url.Values{"id": {job}, "token": {"wrong"}}); code != http.StatusForbidden {
		t.Errorf("cancel with a wrong token: %d, want 403", code)
	}
	if code, body := post(t, rw.URL+"/quarantine/jobs/cancel", url.Values{"id": {job}, "token": {"s3cret"}}); code != http.StatusOK {
		t.Fatalf("cancel: %d\n%s", code, body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body := get(t, rw.URL+"/quarantine/jobs?id="+job)
		if strings.Contains(body, ": cancelled</h1>") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job was not cancelled within 30s:\n%s", body)
		}
		time.Sleep(250 * time.Millisecond) // polling the broker
	}
	open, replayed, _ := openIn(b.snapshot(), "fp-a")
	t.Logf("cancelled job %s: %d replayed, %d open", job, replayed, open)
	if replayed == 0 || open == 0 || open+replayed != n {
		t.Errorf("after the cancel: %d replayed, %d open; want some of each, %d in all", replayed, open, n)
	}
}
