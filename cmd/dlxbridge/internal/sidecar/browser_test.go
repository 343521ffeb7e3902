package sidecar

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A small W3C WebDriver client over chromedriver's HTTP API: enough to
// load a page, find elements, type, click and read text, with no Go
// dependency beyond the standard library.

const webElementKey = "element-6066-11e4-a52e-4f735466cecf"

type browser struct {
	t       *testing.T
	base    string // http://127.0.0.1:PORT/session/ID
	timeout time.Duration
}

// startBrowser starts chromedriver and a headless chromium session, both
// ended at cleanup. Without them it skips, except under CI=true, where
// .ci/run installs them and their absence is a failure.
func startBrowser(t *testing.T) *browser {
	t.Helper()
	driver, errDriver := exec.LookPath("chromedriver")
	chromium, errChromium := exec.LookPath("chromium")
	if errDriver != nil || errChromium != nil {
		msg := fmt.Sprintf("the browser test needs chromium and chromedriver (apt-get install chromium chromium-driver): %v %v", errChromium, errDriver)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(driver, fmt.Sprintf("--port=%d", port), "--allowed-ips=127.0.0.1")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("chromedriver:\n%s", logs.String())
		}
	})
	root := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var status struct {
			Value struct {
				Ready bool `json:"ready"`
			} `json:"value"`
		}
		if err := call(http.MethodGet, root+"/status", nil, &status); err == nil && status.Value.Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("chromedriver did not answer in 20s:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	caps := map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName": "chrome",
		"goog:chromeOptions": map[string]any{
			"binary": chromium,
			"args": []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--window-size=1280,900",
				"--hide-scrollbars", "--force-device-scale-factor=1",
				"--disable-background-networking", "--disable-component-update", "--disable-sync",
				"--disable-dev-shm-usage", "--user-data-dir=" + t.TempDir()},
		},
		// The browser's console, for the page's CSP reports.
		"goog:loggingPrefs": map[string]string{"browser": "ALL"},
	}}}
	var session struct {
		Value struct {
			SessionID string `json:"sessionId"`
		} `json:"value"`
	}
	if err := call(http.MethodPost, root+"/session", caps, &session); err != nil {
		t.Fatalf("new session: %v\n%s", err, logs.String())
	}
	b := &browser{t: t, base: root + "/session/" + session.Value.SessionID, timeout: 15 * time.Second}
	t.Cleanup(func() { _ = call(http.MethodDelete, b.base, nil, nil) })
	b.viewport(1280, 900)
	return b
}

// viewport sizes the window so that the page gets width × height pixels
// (the window's own frame, if any, comes on top).
func (b *browser) viewport(width, height int) {
	b.t.Helper()
	var frame struct{ W, H int }
	b.execute(`return {W: window.outerWidth - window.innerWidth, H: window.outerHeight - window.innerHeight}`, &frame)
	b.do(http.MethodPost, "/window/rect", map[string]int{"width": width + frame.W, "height": height + frame.H}, nil)
	var got struct{ W, H int }
	b.execute(`return {W: window.innerWidth, H: window.innerHeight}`, &got)
	if got.W != width || got.H != height {
		b.t.Fatalf("the viewport is %d × %d, want %d × %d", got.W, got.H, width, height)
	}
}

// call sends one WebDriver command and decodes its answer into out.
func call(method, u string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d %s", method, u, resp.StatusCode, raw)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(raw, out)
}

func (b *browser) do(method, path string, in, out any) {
	b.t.Helper()
	if err := call(method, b.base+path, in, out); err != nil {
		b.t.Fatal(err)
	}
}

// open navigates to u and waits for the load.
func (b *browser) open(u string) {
	b.t.Helper()
	b.do(http.MethodPost, "/url", map[string]string{"url": u}, nil)
}

// all returns the ids of the elements matching a CSS selector, now.
func (b *browser) all(css string) []string {
	b.t.Helper()
	var res struct {
		Value []map[string]string `json:"value"`
	}
	b.do(http.MethodPost, "/elements", map[string]string{"using": "css selector", "value": css}, &res)
	ids := make([]string, len(res.Value))
	for i, e := range res.Value {
		ids[i] = e[webElementKey]
	}
	return ids
}

// find waits for an element matching css (a page that a click loads may
// still be arriving) and returns its id.
func (b *browser) find(css string) string {
	b.t.Helper()
	deadline := time.Now().Add(b.timeout)
	for {
		if ids := b.all(css); len(ids) > 0 {
			return ids[0]
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("no element %q on %s:\n%s", css, b.url(), b.text("body"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *browser) url() string {
	var res struct {
		Value string `json:"value"`
	}
	b.do(http.MethodGet, "/url", nil, &res)
	return res.Value
}

// text is the visible text of the first element matching css.
func (b *browser) text(css string) string {
	b.t.Helper()
	return b.textOf(b.find(css))
}

func (b *browser) textOf(id string) string {
	b.t.Helper()
	var res struct {
		Value string `json:"value"`
	}
	b.do(http.MethodGet, "/element/"+id+"/text", nil, &res)
	return res.Value
}

// waitText waits until the first element matching css shows want. The
// page may be replaced meanwhile (a click's navigation), so an element
// gone stale is looked up again rather than failing the test.
func (b *browser) waitText(css, want string) {
	b.t.Helper()
	deadline := time.Now().Add(b.timeout)
	last := ""
	for {
		var found struct {
			Value map[string]string `json:"value"`
		}
		var text struct {
			Value string `json:"value"`
		}
		if call(http.MethodPost, b.base+"/element", map[string]string{"using": "css selector", "value": css}, &found) == nil &&
			call(http.MethodGet, b.base+"/element/"+found.Value[webElementKey]+"/text", nil, &text) == nil {
			if last = text.Value; strings.Contains(last, want) {
				return
			}
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s shows %q, not %q", css, last, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *browser) click(css string) {
	b.t.Helper()
	b.do(http.MethodPost, "/element/"+b.find(css)+"/click", map[string]any{}, nil)
}

// typeInto clears the field matching css and types s.
func (b *browser) typeInto(css, s string) {
	b.t.Helper()
	id := b.find(css)
	b.do(http.MethodPost, "/element/"+id+"/clear", map[string]any{}, nil)
	b.do(http.MethodPost, "/element/"+id+"/value", map[string]string{"text": s}, nil)
}

// execute runs script in the page (WebDriver's, not the page's: the
// page's CSP does not govern it) and decodes its value into out.
func (b *browser) execute(script string, out any, args ...any) {
	b.t.Helper()
	if args == nil {
		args = []any{}
	}
	var res struct {
		Value json.RawMessage `json:"value"`
	}
	b.do(http.MethodPost, "/execute/sync", map[string]any{"script": script, "args": args}, &res)
	if out != nil {
		if err := json.Unmarshal(res.Value, out); err != nil {
			b.t.Fatalf("execute: %v in %s", err, res.Value)
		}
	}
}

// property is a DOM property of the first element matching css (a
// field's current value, a checkbox's checked).
func (b *browser) property(css, name string) string {
	b.t.Helper()
	var res struct {
		Value any `json:"value"`
	}
	b.do(http.MethodGet, "/element/"+b.find(css)+"/property/"+name, nil, &res)
	return fmt.Sprint(res.Value)
}

// fitsWidth fails the test when the loaded page scrolls sideways at the
// browser's width (1280 px).
func (b *browser) fitsWidth(what string) {
	b.t.Helper()
	var m struct{ Scroll, Inner, Client int }
	b.execute(`return {Scroll: document.documentElement.scrollWidth, Inner: window.innerWidth, Client: document.documentElement.clientWidth}`, &m)
	if m.Inner != 1280 {
		b.t.Errorf("%s: the window is %d px wide, want 1280", what, m.Inner)
	}
	if m.Scroll > m.Inner {
		var wide []string
		b.execute(`return [...document.querySelectorAll("body *")].filter(e => e.getBoundingClientRect().right > window.innerWidth).slice(0, 5).map(e => e.tagName + (e.id ? "#" + e.id : "") + " " + Math.round(e.getBoundingClientRect().right))`, &wide)
		b.t.Errorf("%s: scrolls sideways at %d px: scrollWidth %d; widest: %v", what, m.Inner, m.Scroll, wide)
	}
}

// consoleErrors are the browser's console messages since the last call
// at level SEVERE (a CSP refusal is one).
func (b *browser) consoleErrors() []string {
	b.t.Helper()
	var res struct {
		Value []struct {
			Level   string `json:"level"`
			Message string `json:"message"`
		} `json:"value"`
	}
	b.do(http.MethodPost, "/se/log", map[string]string{"type": "browser"}, &res)
	var out []string
	for _, e := range res.Value {
		// The browser asks every site for a favicon; the page has none.
		if e.Level == "SEVERE" && !strings.Contains(e.Message, "favicon.ico") {
			out = append(out, e.Message)
		}
	}
	return out
}

// Keys of the WebDriver actions API.
const (
	keyTab   = "\uE004"
	keyEnter = "\uE007"
	keySpace = "\uE00D"
)

// focus gives the first element matching css the keyboard focus.
func (b *browser) focus(css string) {
	b.t.Helper()
	b.execute(`arguments[0].focus(); return document.activeElement === arguments[0]`, nil, map[string]string{webElementKey: b.find(css)})
}

// press types one key into whatever has the focus, as a keyboard does.
func (b *browser) press(key string) {
	b.t.Helper()
	b.do(http.MethodPost, "/actions", map[string]any{"actions": []any{map[string]any{"type": "key", "id": "keyboard",
		"actions": []any{map[string]string{"type": "keyDown", "value": key}, map[string]string{"type": "keyUp", "value": key}}}}}, nil)
	b.do(http.MethodDelete, "/actions", nil, nil)
}

// screenshot is a PNG of the viewport.
func (b *browser) screenshot() []byte {
	b.t.Helper()
	var res struct {
		Value string `json:"value"`
	}
	b.do(http.MethodGet, "/screenshot", nil, &res)
	png, err := base64.StdEncoding.DecodeString(res.Value)
	if err != nil {
		b.t.Fatal(err)
	}
	return png
}

// In a real browser: the page shows the groups of a seeded quarantine; an
// operator with the token replays one group through a dry run and its
// confirmation, which moves exactly that group (its records replayed, the
// other group's open, its messages in the work queue); without a token
// the page offers no action and the endpoint answers 403.
func TestBrowserQuarantinePage(t *testing.T) {
	t.Parallel()
	br := startBrowser(t)
	b := setupPage(t)
	b.seedTwoGroups()

	rw := b.server("s3cret")
	br.open(rw.URL + "/quarantine")
	rows := map[string]string{}
	for _, id := range br.all("tr.group") {
		txt := br.textOf(id)
		for _, fp := range []string{"fp-a", "fp-b"} {
			if strings.Contains(txt, fp) {
				rows[fp] = txt
			}
		}
	}
	if len(br.all("tr.group")) != 2 || !strings.Contains(rows["fp-a"], b.q.Name) || !strings.Contains(rows["fp-b"], "payments #payments-oncall") {
		t.Fatalf("groups shown: %q", rows)
	}
	if got := br.text(`tr.group[data-fingerprint="fp-a"] td.open`); got != "3" {
		t.Errorf("fp-a open count %q, want 3", got)
	}
	if got := br.text(`tr.group[data-fingerprint="fp-b"] td.open`); got != "2" {
		t.Errorf("fp-b open count %q, want 2", got)
	}
	// The seeded envelopes were stored without the consumers' key: the
	// page says they are claims, as the CLI's "?" does.
	if got := br.text(`tr.group[data-fingerprint="fp-a"] td.envelopes`); !strings.Contains(got, "3 claimed, not verified") {
		t.Errorf("fp-a envelopes %q, want them marked claimed", got)
	}
	if len(br.all("script")) != 0 {
		t.Errorf("the page holds a script element")
	}

	br.click(`tr.group[data-fingerprint="fp-a"] a.group-link`)
	if got := br.text("#fingerprint"); got != "fp-a" {
		t.Fatalf("group page for %q", got)
	}
	if n := len(br.all("tr.record")); n != 3 {
		t.Fatalf("group page lists %d records, want 3", n)
	}
	if n := len(br.all("tr.record td.verdict.claimed")); n != 3 {
		t.Errorf("group page marks %d records claimed, want 3", n)
	}
	br.click("#scope-group")
	br.typeInto(`#act-form input[name="token"]`, "s3cret")
	br.typeInto(`#act-form input[name="by"]`, "alice")
	br.typeInto(`#act-form input[name="rate"]`, "0")
	br.typeInto(`#act-form input[name="reason"]`, "fixed the handler")
	br.click("#replay-dry-run")
	summary := br.text("#summary")
	if n := len(br.all("tr.planned")); n != 3 || !strings.Contains(summary, "Nothing has changed") {
		t.Fatalf("dry run lists %d records: %q", n, summary)
	}
	if o, _, _ := openIn(b.snapshot(), "fp-a"); o != 3 {
		t.Fatalf("the dry run moved records: %d open", o)
	}
	if note := br.text("#unverified-note"); !strings.HasPrefix(note, "3 of the record(s)") {
		t.Errorf("the dry run's note on unverified envelopes: %q", note)
	}
	br.click("#confirm")
	br.waitText("#summary", "Replayed 3 of 3")
	b.replayed(b.snapshot(), 0, 3)
	ch := b.env.Channel("page-work")
	for i := 0; i < 3; i++ {
		d, ok, err := ch.Get(b.q.Name, true)
		if err != nil || !ok || !strings.HasPrefix(string(d.Body), `{"id":"a-`) {
			t.Errorf("work queue message %d: %v %v %q", i, ok, err, d.Body)
		}
	}

	ro := b.server("")
	br.open(ro.URL + "/quarantine")
	br.find("#read-only")
	br.click(`tr.group[data-fingerprint="fp-b"] a.group-link`)
	if got := br.text("#fingerprint"); got != "fp-b" {
		t.Fatalf("group page for %q", got)
	}
	if n := len(br.all("form")) + len(br.all("button")) + len(br.all("input")); n != 0 {
		t.Errorf("read-only page offers %d form elements", n)
	}
	if code, _ := post(t, ro.URL+"/quarantine/replay", map[string][]string{"queue": {b.q.Name}, "fingerprint": {"fp-b"}, "token": {"s3cret"}}); code != http.StatusForbidden {
		t.Errorf("read-only replay: %d, want 403", code)
	}
	if o, _, _ := openIn(b.snapshot(), "fp-b"); o != 2 {
		t.Errorf("fp-b: %d open after the refused replay, want 2", o)
	}
}
