package sidecar

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// `dlxbridge run` on a list of three nodes, the first one down: it starts
// on the second and says so (its log, /readyz); when the second goes down
// it moves to the third, /readyz names it, and messages flow again.
func TestRunFailsOverAcrossNodes(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	second, third := env.Proxy(), env.Proxy()
	got := make(chan string, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get(HeaderMessageID)
	}))
	defer srv.Close()
	p := startSidecarURL(t, env, writeSidecarConfig(t, env, srv.URL, 1), "amqp://guest:guest@127.0.0.1:1/,"+second.URL+","+third.URL)

	code, body := p.get("/readyz")
	if code != 200 || !strings.Contains(body, "node: "+second.Addr+" (cluster ") {
		t.Fatalf("/readyz = %d %q, want ready on %s with its cluster", code, body, second.Addr)
	}
	log := p.stderr.String()
	for _, s := range []string{
		`msg="node did not answer; trying the next" component=dlxbridge.run node=127.0.0.1:1`,
		"msg=connected component=dlxbridge.consumer node=" + second.Addr + " cluster=",
	} {
		if !strings.Contains(log, s) {
			t.Errorf("the log lacks %q", s)
		}
	}
	// A message forwarded just before the cut may come again (its ack
	// was lost with the node): at-least-once. Anything else is wrong.
	seen := map[string]int{}
	receive := func(id string) {
		t.Helper()
		publish(t, env, env.Name("ex"), map[string]string{id: `{"id":"` + id + `"}`})
		for {
			select {
			case g := <-got:
				seen[g]++
				if g == id {
					return
				}
				if seen[g] == 1 {
					t.Fatalf("forwarded %q, want %q", g, id)
				}
				t.Logf("%s forwarded again (in flight at the cut)", g)
			case <-time.After(20 * time.Second):
				t.Fatalf("%s was not forwarded\n%s", id, p.stderr.String())
			}
		}
	}
	receive("before")

	second.Down()
	cut := time.Now()
	deadline := cut.Add(30 * time.Second)
	for {
		code, body = p.get("/readyz")
		if code == 200 && strings.Contains(body, "node: "+third.Addr+" ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q 30s after the node went down, want ready on %s", code, body, third.Addr)
		}
		time.Sleep(5 * time.Millisecond) // an HTTP endpoint has no events
	}
	t.Logf("ready on the third node %s after the second went down", time.Since(cut).Round(time.Millisecond))
	receive("after")
	if strings.Contains(p.stderr.String(), "guest:guest") {
		t.Error("the log shows a password")
	}
}
