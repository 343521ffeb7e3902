package sidecar

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// `dlxbridge run` serves the page: read-only by default (POST 403); with
// run.operator_token_env naming a variable, that variable's value is the
// token. (The test names PATH, which the process inherits, so that it
// needs no t.Setenv and can run in parallel.)
func TestRunServesTheQuarantinePage(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(srv.Close)
	ro := startSidecar(t, env, srv.URL+"/work", 1)
	if code, body := ro.get("/quarantine"); code != http.StatusOK || !strings.Contains(body, `id="read-only"`) {
		t.Fatalf("GET /quarantine: %d\n%s", code, body)
	}
	form := url.Values{"queue": {env.Name("work")}, "class": {"permanent"}, "fingerprint": {"none"}, "token": {os.Getenv("PATH")}}
	if code, _ := post(t, "http://"+ro.addr+"/quarantine/replay", form); code != http.StatusForbidden {
		t.Errorf("read-only run: POST replay %d, want 403", code)
	}

	cfgPath := writeSidecarConfig(t, env, srv.URL+"/work", 1)
	doc, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	doc = []byte(strings.Replace(string(doc), "run:\n", "run:\n  operator_token_env: PATH\n", 1))
	if err := os.WriteFile(cfgPath, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	rw := startSidecarOn(t, env, cfgPath)
	if code, body := post(t, "http://"+rw.addr+"/quarantine/replay", form); code != http.StatusOK || !strings.Contains(body, "0 open record(s) selected") {
		t.Errorf("operator run: dry run %d\n%s", code, body)
	}
	form.Set("token", "wrong")
	if code, _ := post(t, "http://"+rw.addr+"/quarantine/replay", form); code != http.StatusForbidden {
		t.Errorf("operator run, wrong token: %d, want 403", code)
	}
}
