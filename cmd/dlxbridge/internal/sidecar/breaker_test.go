package sidecar

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// The outage through the sidecar: the endpoint answers 503 for 10s
// from its first request, then 200. Each 503 is a dependency signal, so the
// queue's breaker pauses it: the endpoint is called a handful of times
// during the outage, nothing is quarantined, and every message is then
// forwarded with success exactly once. /readyz lists the paused queue and
// stays ready.
func TestRunPausesQueueWhileEndpointAnswers503(t *testing.T) {
	t.Parallel()
	for _, retryAfter := range []string{"", "1"} {
		name := "breaker-backoff"
		if retryAfter != "" {
			name = "retry-after-" + retryAfter
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := brokertest.Require(t)
			const n, outage = 60, 10 * time.Second
			var mu sync.Mutex
			var start time.Time
			failed, ok := 0, map[string]int{}
			ep := &endpoint{attempts: map[string][]time.Time{}, answer: func(id string, _ int, w http.ResponseWriter) {
				mu.Lock()
				defer mu.Unlock()
				if start.IsZero() {
					start = time.Now()
				}
				if time.Since(start) < outage {
					failed++
					if retryAfter != "" {
						w.Header().Set("Retry-After", retryAfter)
					}
					http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
					return
				}
				ok[id]++
				w.WriteHeader(http.StatusNoContent)
			}}
			srv := httptest.NewServer(ep)
			defer srv.Close()
			cfgPath := writeSidecarConfig(t, env, srv.URL+"/jobs", 2)
			appendQueueKey(t, cfgPath, "breaker: {min_open: 1s, max_open: 3s}")
			p := startSidecarOn(t, env, cfgPath)
			bodies := map[string]string{}
			for i := range n {
				id := fmt.Sprintf("m-%d", i)
				bodies[id] = fmt.Sprintf(`{"id":%q}`, id)
			}
			publish(t, env, env.Name("ex"), bodies)

			// During the outage /readyz lists the queue as paused, and is
			// still ready (polled: HTTP has no events).
			deadline := time.Now().Add(outage)
			for {
				code, body := p.get("/readyz")
				if strings.Contains(body, "paused: "+p.queue) {
					if code != http.StatusOK {
						t.Errorf("/readyz answered %d with a paused queue, want 200:\n%s", code, body)
					}
					t.Logf("/readyz during the outage: %q", body)
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("/readyz never listed the paused queue during the outage (last: %d %q)", code, body)
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if g := p.counter(fmt.Sprintf(`dlxbridge_breaker_state{queue=%q}`, p.queue)); g == 0 {
				t.Logf("dlxbridge_breaker_state = 0 just after /readyz said paused (the breaker may have closed meanwhile)")
			}

			q := p.queue
			p.waitCounter(fmt.Sprintf(`dlxbridge_deliveries_total{outcome="acked",queue=%q}`, q), n, outage+60*time.Second)
			mu.Lock()
			defer mu.Unlock()
			retried := p.counter(fmt.Sprintf(`dlxbridge_deliveries_total{outcome="retried",queue=%q}`, q))
			opens := 0.0
			for _, line := range strings.Split(func() string { _, b := p.get("/metrics"); return b }(), "\n") {
				if strings.HasPrefix(line, "dlxbridge_breaker_transitions_total{") && strings.Contains(line, `to="open"`) {
					var v float64
					_, _ = fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
					opens += v
				}
			}
			t.Logf("outage %s: %d requests answered 503 for %d messages, %v retried, %v opens", outage, failed, n, retried, opens)
			if failed > 30 {
				t.Errorf("%d requests answered 503 during the outage, want at most 30 (the queue held %d)", failed, n)
			}
			if opens < 1 {
				t.Errorf("the breaker never opened")
			}
			if got := p.counter(fmt.Sprintf(`dlxbridge_deliveries_total{outcome="quarantined",queue=%q}`, q)); got != 0 {
				t.Errorf("%v messages quarantined because of the outage", got)
			}
			for id := range bodies {
				if ok[id] != 1 {
					t.Errorf("%s: forwarded with success %d times, want 1", id, ok[id])
				}
			}
			if g := p.counter(fmt.Sprintf(`dlxbridge_breaker_state{queue=%q}`, q)); g != 0 {
				t.Errorf("dlxbridge_breaker_state = %v after the recovery, want 0", g)
			}
			if d := queueDepth(t, env, p.quar); d != 0 {
				t.Errorf("quarantine holds %d", d)
			}
		})
	}
}

// appendQueueKey adds a key to the queue of the config that
// writeSidecarConfig wrote at cfgPath.
func appendQueueKey(t *testing.T, cfgPath, line string) {
	t.Helper()
	f, err := os.OpenFile(cfgPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("    " + line + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}
