package sidecar

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
)

// unreachable is a page whose broker is never reached: what these tests
// check is answered before any read.
func unreachable(token string, allowed ...string) *Page {
	return &Page{Config: &config.Config{}, Token: token, AllowedHosts: allowed,
		Dial:   func() (*amqp.Connection, error) { return nil, errors.New("no broker in this test") },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// A page reached under another name (a DNS-rebinding site's, in an
// operator's browser) answers 421 and reads nothing; its own address,
// localhost on loopback and the configured names are answered.
func TestPageRefusesForeignHosts(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(unreachable("", "console.example", "proxy.example:8443").Handler())
	defer srv.Close()
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	for _, host := range []string{"attacker.example:" + port, "attacker.example", "127.0.0.1.attacker.example:" + port,
		"localhost:1", "proxy.example:8080", "127.0.0.1:1"} {
		for _, path := range []string{"/quarantine", "/quarantine/record/x", "/quarantine/group?queue=q"} {
			code, body := withHost(t, http.MethodGet, srv.URL+path, host, nil)
			if code != http.StatusMisdirectedRequest || !strings.Contains(body, "run.allowed_hosts") {
				t.Errorf("Host %q %s: %d %q, want 421 naming run.allowed_hosts", host, path, code, body)
			}
		}
	}
	// Answered: the broker is unreachable here, so 502, never 421.
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST:" + port, "[::1]:" + port, "console.example:1", "proxy.example:8443"} {
		if code, body := withHost(t, http.MethodGet, srv.URL+"/quarantine", host, nil); code != http.StatusBadGateway {
			t.Errorf("Host %q: %d %q, want the page (502 without a broker)", host, code, body)
		}
	}
}

// Wrong tokens are slowed down per client: past a few, even the right one
// waits (429 with Retry-After), and the WARN lines about them are bounded.
func TestPageSlowsDownTokenGuessing(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var mu sync.Mutex
	p := unreachable("0123456789abcdef-right")
	p.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	now := time.Unix(1e9, 0)
	p.now = func() time.Time { return now }
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	form := url.Values{"queue": {"q"}, "token": {"guess"}}
	var forbidden, limited int
	for i := 0; i < 40; i++ {
		switch code, _ := post(t, srv.URL+"/quarantine/replay", form); code {
		case http.StatusForbidden:
			forbidden++
		case http.StatusTooManyRequests:
			limited++
		default:
			t.Fatalf("guess %d: %d", i, code)
		}
	}
	if forbidden > failBurst || limited < 40-failBurst {
		t.Errorf("40 guesses at once: %d checked, %d slowed down; want at most %d checked", forbidden, limited, failBurst)
	}
	form.Set("token", "0123456789abcdef-right")
	if code, _ := post(t, srv.URL+"/quarantine/replay", form); code != http.StatusTooManyRequests {
		t.Errorf("the right token while slowed down: %d, want 429", code)
	}
	mu.Lock()
	lines := strings.Count(logs.String(), "refused an operator token")
	mu.Unlock()
	if lines != 1 {
		t.Errorf("%d WARN lines for one burst of refusals, want 1", lines)
	}
	now = now.Add(failRefill)
	if code, _ := post(t, srv.URL+"/quarantine/replay", form); code == http.StatusTooManyRequests || code == http.StatusForbidden {
		t.Errorf("the right token after the wait: %d", code)
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// The limiter tracks a bounded number of clients however many addresses
// fail.
func TestFailLimiterMemoryIsBounded(t *testing.T) {
	t.Parallel()
	var l failLimiter
	now := time.Unix(1e9, 0)
	for i := 0; i < 3*failClients; i++ {
		l.failed("10.0."+strings.Repeat("x", i%7)+string(rune('a'+i%26))+"."+time.Duration(i).String(), now)
	}
	if n := len(l.clients); n > failClients {
		t.Errorf("%d clients tracked, want at most %d", n, failClients)
	}
}

func TestTokenMatchesComparesDigests(t *testing.T) {
	t.Parallel()
	if !tokenMatches("0123456789abcdef", "0123456789abcdef") || tokenMatches("0123456789abcde", "0123456789abcdef") || tokenMatches("", "x") {
		t.Error("tokenMatches is wrong")
	}
}

// A confirmation is single-use, for its own action only, and expires; the
// store of them stays bounded.
func TestConfirmationsAreSingleUseAndBounded(t *testing.T) {
	t.Parallel()
	var c confirmations
	now := time.Unix(1e9, 0)
	sel := selection{Queue: "q", Picked: []string{"a", "b"}}
	id := c.issue("replay", sel, []string{"a", "b"}, now)
	if _, ok := c.take(id, "purge", now); ok {
		t.Error("a replay's confirmation confirmed a purge")
	}
	id = c.issue("replay", sel, []string{"a"}, now)
	if pd, ok := c.take(id, "replay", now); !ok || !reflect.DeepEqual(pd.sel, sel) || len(pd.ids) != 1 {
		t.Errorf("take: %+v %v", pd, ok)
	}
	if _, ok := c.take(id, "replay", now); ok {
		t.Error("a confirmation was used twice")
	}
	id = c.issue("replay", sel, nil, now)
	if _, ok := c.take(id, "replay", now.Add(confirmTTL+time.Second)); ok {
		t.Error("an expired confirmation was accepted")
	}
	for i := 0; i < 10*maxConfirmations; i++ {
		id := c.issue("replay", sel, nil, now)
		if i%2 == 0 {
			c.take(id, "replay", now)
		}
	}
	if len(c.byID) > maxConfirmations || len(c.order) > 2*maxConfirmations+1 {
		t.Errorf("%d confirmations, %d ids in order; want at most %d", len(c.byID), len(c.order), maxConfirmations)
	}
}

var confirmationRE = regexp.MustCompile(`name="confirmation" value="([0-9a-f]{32})"`)

// The dry run's page carries a single-use confirmation, never the token;
// the confirmation alone moves exactly the dry run's records, once.
func TestPageConfirmsWithoutTheToken(t *testing.T) {
	t.Parallel()
	b := setupPage(t)
	b.seedTwoGroups()
	b.keep(5)
	const token = "0123456789abcdef-operator"
	rw := b.server(token)
	sel := url.Values{"queue": {b.q.Name}, "class": {"permanent"}, "fingerprint": {"fp-a"}, "token": {token}, "reason": {"fixed"}, "rate": {"0"}}
	code, body := post(t, rw.URL+"/quarantine/replay", sel)
	if code != http.StatusOK || strings.Contains(body, token) {
		t.Fatalf("dry run: %d, token in the page: %v\n%s", code, strings.Contains(body, token), body)
	}
	m := confirmationRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no confirmation in the dry run:\n%s", body)
	}
	// The purge endpoint does not take a replay's confirmation (and it is
	// spent by the try).
	other := url.Values{"confirmation": {m[1]}, "confirm": {"1"}}
	if code, _ := post(t, rw.URL+"/quarantine/purge", other); code != http.StatusForbidden {
		t.Errorf("replay confirmation on purge: %d, want 403", code)
	}
	code, body = post(t, rw.URL+"/quarantine/replay", sel)
	m = confirmationRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("second dry run: %d\n%s", code, body)
	}
	// The form's selection fields cannot widen what the dry run chose.
	confirm := url.Values{"confirmation": {m[1]}, "confirm": {"1"}, "queue": {b.q.Name}, "class": {"permanent"}, "fingerprint": {"fp-b"}}
	if code, body = post(t, rw.URL+"/quarantine/replay", confirm); code != http.StatusOK || !strings.Contains(body, "Replayed 3 of 3") {
		t.Fatalf("confirm: %d\n%s", code, body)
	}
	b.replayed(b.snapshot(), 0, 3)
	if code, _ := post(t, rw.URL+"/quarantine/replay", confirm); code != http.StatusForbidden {
		t.Errorf("the confirmation used twice: %d, want 403", code)
	}
}

// An IPv6 client is limited by its /64: one host can pick any address in
// it, so wrong tokens from one /64 share a bucket however they rotate,
// while another /64, and every IPv4 address, has its own.
func TestFailLimiterKeysIPv6ByItsSlash64(t *testing.T) {
	t.Parallel()
	for remote, want := range map[string]string{
		"[2001:db8:1:2::1]:1234":      "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::9]:80":   "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]:1":         "2001:db8:1:3::/64",
		"[fe80::1%eth0]:1":            "fe80::/64",
		"[::ffff:192.0.2.7]:5":        "192.0.2.7",
		"192.0.2.7:5":                 "192.0.2.7",
		"192.0.2.8:5":                 "192.0.2.8",
		"not an address":              "not an address",
		"2001:db8:1:2:aaaa:bbbb:cc:d": "2001:db8:1:2::/64",
	} {
		if got := clientKey(remote); got != want {
			t.Errorf("clientKey(%q) = %q, want %q", remote, got, want)
		}
	}

	p := unreachable("0123456789abcdef-right")
	now := time.Unix(1e9, 0)
	p.now = func() time.Time { return now }
	h := p.Handler()
	try := func(remote string) int {
		form := url.Values{"queue": {"q"}, "token": {"guess"}}
		req := httptest.NewRequest(http.MethodPost, "http://page.example/quarantine/replay", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	p.AllowedHosts = []string{"page.example"}
	for i := range failBurst {
		if code := try(fmt.Sprintf("[2001:db8:1:2::%x]:4000", i+1)); code != http.StatusForbidden {
			t.Fatalf("guess %d: %d, want 403", i, code)
		}
	}
	if code := try("[2001:db8:1:2:dead:beef:0:1]:4000"); code != http.StatusTooManyRequests {
		t.Errorf("a new address in the same /64: %d, want 429", code)
	}
	if code := try("[2001:db8:1:3::1]:4000"); code != http.StatusForbidden {
		t.Errorf("another /64: %d, want 403 (checked, not slowed down)", code)
	}
}

// A form another site's page makes an operator's browser send (a hidden
// form posted to 127.0.0.1:9180, with made-up tokens) is refused before
// its token is looked at: it must not use up the tries of the operator's
// own address (every local browser shares 127.0.0.1) and lock them out.
// A request without the browser's Origin and Sec-Fetch-Site headers (curl,
// a script) and a same-origin form are checked as before.
func TestPageRefusesCrossSiteForms(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-right"
	p := unreachable(token)
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	send := func(tok string, h map[string]string) (int, string) {
		form := url.Values{"queue": {"q"}, "token": {tok}}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/quarantine/replay", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, h := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
		{"Origin": "https://evil.example"},
		{"Sec-Fetch-Site": "same-site", "Origin": "http://other.localhost:9180"},
	} {
		for range 2 * failBurst {
			if code, body := send("guess-0123456789abcdef", h); code != http.StatusForbidden || !strings.Contains(body, "cross-origin") {
				t.Fatalf("a cross-site form %v: %d %q, want 403 saying cross-origin", h, code, body)
			}
		}
	}
	// The operator's own form is not slowed down by what the other site sent.
	u, _ := url.Parse(srv.URL)
	if code, body := send(token, map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://" + u.Host}); code == http.StatusTooManyRequests || code == http.StatusForbidden {
		t.Errorf("the operator's own form after the other site's: %d %s", code, body)
	}
	if code, _ := send(token, nil); code == http.StatusTooManyRequests || code == http.StatusForbidden {
		t.Errorf("a form from a client without browser headers: %d", code)
	}
}
