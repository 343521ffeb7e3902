package sidecar

import (
	"context"
	"encoding/base64"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
)

// hostile is what a producer could put in a payload, a header or an error.
const hostile = `<script>alert("pwned")</script>`

// pageBundle is one quarantine page test: a work queue with its
// quarantine declared under the test's prefix (deleted at cleanup), a
// schema registry, and records seeded the way the runtime writes them
// (an envelope on the intake, stored by a quarantine.Keeper).
type pageBundle struct {
	t   *testing.T
	env *brokertest.Env
	cfg *config.Config
	q   *config.Queue
	reg *schemas.Registry
	pub *amqp.Channel
}

func setupPage(t *testing.T) *pageBundle {
	t.Helper()
	return setupPageQueues(t, pageQueue{"work", config.Owner{Team: "payments", Contact: "#payments-oncall"}})
}

// pageQueue is a work queue of a page test, named under the test's
// prefix.
type pageQueue struct {
	Name  string
	Owner config.Owner
}

// setupPageQueues declares the queues (the first is b.q) with their
// quarantines.
func setupPageQueues(t *testing.T, queues ...pageQueue) *pageBundle {
	t.Helper()
	return setupPageQueuesOn(t, brokertest.Require(t), queues...)
}

// setupPageQueuesOn is setupPageQueues on the broker of env (a private
// node's, say).
func setupPageQueuesOn(t *testing.T, env *brokertest.Env, queues ...pageQueue) *pageBundle {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "test.job"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test.job", "v1.json"), []byte(jobSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := schemas.Load(schemas.LoadOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{Broker: config.Broker{ConnectionName: env.Prefix}}
	for _, q := range queues {
		cfg.Queues = append(cfg.Queues, config.Queue{
			Name:     env.Name(q.Name),
			Exchange: config.Exchange{Name: env.Name(q.Name + "-ex"), Type: "direct"},
			Bindings: []string{"k"},
			Retry:    config.Retry{Tiers: []time.Duration{200 * time.Millisecond}},
			Accepts:  []config.Accept{{Type: "test.job", Versions: []string{"1"}}},
			Owner:    q.Owner,
		})
	}
	if len(queues) == 1 {
		cfg.Queues[0].Exchange.Name = env.Name("ex")
	}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	conn := env.Dial("page-topology")
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&topology.Broker{Conn: conn}).Apply(context.Background(), topo); err != nil {
		t.Fatal(err)
	}
	pub := env.Channel("page-producer")
	if err := pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return &pageBundle{t: t, env: env, cfg: cfg, q: &cfg.Queues[0], reg: reg, pub: pub}
}

// quarantine puts n test.job messages of one fingerprint on the intake, as
// the runtime does, each with body(i), errText in its envelope and the
// extra headers.
func (b *pageBundle) quarantine(n int, fingerprint, errText string, body func(i int) string, extra amqp.Table) {
	b.t.Helper()
	b.seed(b.q, seedSpec{N: n, Fingerprint: fingerprint, Error: errText, Body: body, Headers: extra})
}

// seedSpec is a run of records for seed: N messages of one group.
type seedSpec struct {
	N                  int
	Fingerprint, Error string
	Class, Reason      string                    // default permanent, "handler refused it"
	Body               func(i int) string        // the payload
	MessageID          func(i int) string        // default FINGERPRINT-i
	Ago                func(i int) time.Duration // how long ago it was quarantined; default 0
	Headers            amqp.Table
}

// seed puts spec's messages on q's intake with the envelope the runtime
// writes; a keeper (keep) stores them.
func (b *pageBundle) seed(q *config.Queue, spec seedSpec) {
	b.t.Helper()
	now := time.Now().UTC()
	if spec.Class == "" {
		spec.Class = "permanent"
	}
	if spec.Reason == "" {
		spec.Reason = "handler refused it"
	}
	for i := 0; i < spec.N; i++ {
		h := amqp.Table{"schema-version": "1"}
		for k, v := range spec.Headers {
			h[k] = v
		}
		at := now
		if spec.Ago != nil {
			at = now.Add(-spec.Ago(i))
		}
		id := fmt.Sprintf("%s-%d", spec.Fingerprint, i)
		if spec.MessageID != nil {
			id = spec.MessageID(i)
		}
		e := quarantine.Envelope{Source: quarantine.SourceBridge, Class: triage.Class(spec.Class), Reason: spec.Reason, Error: spec.Error,
			Fingerprint: spec.Fingerprint, Attempts: 1, QuarantinedAt: at, OriginalQueue: q.Name, OriginalExchange: q.Exchange.Name,
			OriginalRouting: "k", MessageType: "test.job", SchemaVersion: "1"}
		e.Apply(h)
		conf, err := b.pub.PublishWithDeferredConfirmWithContext(context.Background(), "", q.Quarantine.Queue, true, false, amqp.Publishing{
			MessageId: id, Type: "test.job", ContentType: "application/json",
			Headers: h, Body: []byte(spec.Body(i)),
		})
		if err != nil {
			b.t.Fatal(err)
		}
		if ok, err := conf.WaitContext(context.Background()); err != nil || !ok {
			b.t.Fatalf("publish to the intake: ack %v, %v", ok, err)
		}
	}
}

// keep runs a quarantine.Keeper per quarantine until the records streams
// hold want records, then stops them.
func (b *pageBundle) keep(want int) {
	b.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, len(b.cfg.Queues))
	for i := range b.cfg.Queues {
		q := &b.cfg.Queues[i]
		k := &quarantine.Keeper{Consume: b.env.Dial("page-keeper"), Publish: b.env.Dial("page-keeper-pub"),
			Intake: q.Quarantine.Queue, Records: q.Quarantine.RecordsStream()}
		go func() { done <- k.Run(ctx) }()
	}
	running := len(b.cfg.Queues)
	defer func() {
		cancel()
		for ; running > 0; running-- {
			if err := <-done; err != nil {
				b.t.Errorf("keeper: %v", err)
			}
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if n := len(b.snapshot().Records); n >= want {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("the keeper stored fewer than %d records in 30s", want)
		}
		select {
		case err := <-done:
			running--
			b.t.Fatalf("keeper stopped: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (b *pageBundle) snapshot() *quarantine.Snapshot {
	b.t.Helper()
	conn := b.env.Dial("page-check")
	defer conn.Close()
	s, err := (&quarantine.Inspector{Conn: conn, Config: b.cfg}).Snapshot(context.Background())
	if err != nil {
		b.t.Fatal(err)
	}
	return s
}

// server serves the page with the given operator token ("" read-only).
func (b *pageBundle) server(token string) *httptest.Server {
	p := &Page{Config: b.cfg, Registry: b.reg, Token: token,
		Dial: func() (*amqp.Connection, error) { return b.env.Dial("page"), nil }}
	srv := httptest.NewServer(p.Handler())
	b.t.Cleanup(srv.Close)
	return srv
}

// seedTwoGroups: three valid records of fp-a, two of fp-b whose payload,
// error and a header carry markup.
func (b *pageBundle) seedTwoGroups() {
	b.quarantine(3, "fp-a", "failed fp-a", func(i int) string { return fmt.Sprintf(`{"id":"a-%d"}`, i) }, nil)
	b.quarantine(2, "fp-b", "boom "+hostile, func(i int) string { return fmt.Sprintf(`{"id":"b-%d %s"}`, i, hostile) },
		amqp.Table{"x-note": hostile})
	b.keep(5)
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	return roundTrip(t, http.MethodGet, u, nil)
}

func post(t *testing.T, u string, form url.Values) (int, string) {
	t.Helper()
	return roundTrip(t, http.MethodPost, u, form)
}

// roundTrip sends one request (form, if not nil, as its body) and returns
// the status and the body.
func roundTrip(t *testing.T, method, u string, form url.Values) (int, string) {
	t.Helper()
	return withHost(t, method, u, "", form)
}

// withHost is roundTrip with the Host header set to host ("" for the
// URL's).
func withHost(t *testing.T, method, u, host string, form url.Values) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(got)
}

// replayed checks that fp-a has open and replayed records, that fp-b's two
// are all still open, and that the work queue holds the replayed ones.
func (b *pageBundle) replayed(snap *quarantine.Snapshot, open, replayed int) {
	b.t.Helper()
	if o, r, _ := openIn(snap, "fp-a"); o != open || r != replayed {
		b.t.Errorf("fp-a: %d open, %d replayed; want %d, %d", o, r, open, replayed)
	}
	if o, r, _ := openIn(snap, "fp-b"); o != 2 || r != 0 {
		b.t.Errorf("fp-b: %d open, %d replayed; want 2, 0", o, r)
	}
	if n := queueDepth(b.t, b.env, b.q.Name); n != replayed {
		b.t.Errorf("work queue holds %d, want %d", n, replayed)
	}
}

// openIn counts the open records of fingerprint fp.
func openIn(s *quarantine.Snapshot, fp string) (open, replayed, purged int) {
	for _, r := range s.Records {
		if r.Envelope.Fingerprint != fp {
			continue
		}
		switch r.State {
		case quarantine.StateOpen:
			open++
		case quarantine.StateReplayed:
			replayed++
		case quarantine.StatePurged:
			purged++
		}
	}
	return
}

// Markup in a payload, an error or a header is shown as text on every view
// and never reaches the page as markup.
func TestPageEscapesWhatProducersSent(t *testing.T) {
	t.Parallel()
	b := setupPage(t)
	b.seedTwoGroups()
	srv := b.server("")
	var hostileID string
	for _, r := range b.snapshot().Records {
		if r.Envelope.Fingerprint == "fp-b" {
			hostileID = r.ID
		}
	}
	escaped := "&lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;"
	for _, path := range []string{"/quarantine", "/quarantine/group?" + groupQuery(b.q.Name, "permanent", "fp-b").Encode(), "/quarantine/record/" + hostileID} {
		code, body := get(t, srv.URL+path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		if strings.Contains(body, "<script") {
			t.Errorf("GET %s: markup reached the page:\n%s", path, body)
		}
		if path != "/quarantine" && !strings.Contains(body, escaped) {
			t.Errorf("GET %s: the hostile text is not shown escaped", path)
		}
	}
	_, body := get(t, srv.URL+"/quarantine/record/"+hostileID)
	for _, want := range []string{`<th scope="row">x-note</th><td>` + escaped, `<pre id="payload">{&#34;id&#34;:&#34;b-`, `<pre id="error-text">boom ` + escaped} {
		if !strings.Contains(body, want) {
			t.Errorf("record page lacks %q:\n%s", want, body)
		}
	}
}

// Without a token the page renders no form and refuses every action, even
// one carrying a token; with one, a wrong token is refused, a dry run
// moves nothing, and the confirmation moves exactly the dry run's records.
func TestPageActionsNeedTheTokenAndADryRun(t *testing.T) {
	t.Parallel()
	b := setupPage(t)
	b.seedTwoGroups()
	// A fingerprint that fp-a prefixes: a quarantine.Filter would match it.
	b.quarantine(1, "fp-a2", "failed fp-a2", func(int) string { return `{"id":"a2"}` }, nil)
	b.keep(6)
	group := "/quarantine/group?" + groupQuery(b.q.Name, "permanent", "fp-a").Encode()
	sel := url.Values{"queue": {b.q.Name}, "class": {"permanent"}, "fingerprint": {"fp-a"}, "token": {"s3cret"}, "reason": {"fixed"}}

	ro := b.server("")
	_, body := get(t, ro.URL+group)
	if strings.Contains(body, "<form") || strings.Contains(body, "<button") {
		t.Errorf("read-only group page offers an action:\n%s", body)
	}
	for _, path := range []string{"/quarantine/replay", "/quarantine/purge"} {
		if code, _ := post(t, ro.URL+path, sel); code != http.StatusForbidden {
			t.Errorf("read-only POST %s: %d, want 403", path, code)
		}
	}
	for _, method := range []string{http.MethodGet, http.MethodPut} {
		if code, _ := roundTrip(t, method, ro.URL+"/quarantine/replay", nil); code != http.StatusMethodNotAllowed {
			t.Errorf("%s /quarantine/replay: %d, want 405", method, code)
		}
	}

	rw := b.server("s3cret")
	_, body = get(t, rw.URL+group)
	if !strings.Contains(body, `id="replay-dry-run"`) || !strings.Contains(body, `id="purge-dry-run"`) || strings.Contains(body, "s3cret") {
		t.Errorf("operator group page: forms missing or the token shown:\n%s", body)
	}
	wrong := url.Values{}
	for k, v := range sel {
		wrong[k] = v
	}
	wrong.Set("token", "s3creT")
	if code, _ := post(t, rw.URL+"/quarantine/replay", wrong); code != http.StatusForbidden {
		t.Errorf("wrong token: %d, want 403", code)
	}
	noReason := url.Values{"queue": {b.q.Name}, "class": {"permanent"}, "fingerprint": {"fp-b"}, "token": {"s3cret"}}
	if code, _ := post(t, rw.URL+"/quarantine/purge", noReason); code != http.StatusBadRequest {
		t.Errorf("purge without a reason: %d, want 400", code)
	}
	confirmNoIDs := url.Values{"confirm": {"1"}}
	for k, v := range sel {
		confirmNoIDs[k] = v
	}
	if code, _ := post(t, rw.URL+"/quarantine/replay", confirmNoIDs); code != http.StatusBadRequest {
		t.Errorf("confirm without the dry run's ids: %d, want 400", code)
	}

	code, body := post(t, rw.URL+"/quarantine/replay", sel)
	if code != http.StatusOK || strings.Count(body, `class="planned"`) != 3 || !strings.Contains(body, `id="confirm"`) {
		t.Fatalf("dry run: %d\n%s", code, body)
	}
	if o, r, _ := openIn(b.snapshot(), "fp-a"); o != 3 || r != 0 {
		t.Fatalf("after the dry run fp-a: %d open, %d replayed", o, r)
	}
	if n := queueDepth(t, b.env, b.q.Name); n != 0 {
		t.Fatalf("the dry run sent %d", n)
	}
	// The confirmation names two of the three: only those move.
	var ids []string
	for _, r := range inGroup(b.snapshot(), b.q.Name, "permanent", "fp-a") {
		ids = append(ids, r.ID)
	}
	confirm := url.Values{"confirm": {"1"}, "ids": {strings.Join(ids[:2], ",")}, "rate": {"0"}, "by": {"alice"}}
	for k, v := range sel {
		confirm[k] = v
	}
	code, body = post(t, rw.URL+"/quarantine/replay", confirm)
	if code != http.StatusOK || !strings.Contains(body, "Replayed 2 of 2") {
		t.Fatalf("confirm: %d\n%s", code, body)
	}
	snap := b.snapshot()
	b.replayed(snap, 1, 2)
	if o, _, _ := openIn(snap, "fp-a2"); o != 1 {
		t.Errorf("fp-a2: %d open, want 1", o)
	}
	audited := false
	for _, e := range snap.Events {
		audited = audited || (e.Kind == quarantine.EventReplayStarted && e.By == "web:alice" && e.Reason == "fixed")
	}
	if !audited {
		t.Errorf("no replay-started event by web:alice: %+v", snap.Events)
	}

	// Purge, the same way: a dry run, then its ids confirmed.
	purge := url.Values{"queue": {b.q.Name}, "class": {"permanent"}, "fingerprint": {"fp-b"}, "token": {"s3cret"}, "reason": {"known bad"}}
	code, body = post(t, rw.URL+"/quarantine/purge", purge)
	if code != http.StatusOK || strings.Count(body, `class="planned"`) != 2 {
		t.Fatalf("purge dry run: %d\n%s", code, body)
	}
	ids = nil
	for _, r := range inGroup(b.snapshot(), b.q.Name, "permanent", "fp-b") {
		ids = append(ids, r.ID)
	}
	purge.Set("confirm", "1")
	purge.Set("ids", strings.Join(ids, ","))
	if code, body = post(t, rw.URL+"/quarantine/purge", purge); code != http.StatusOK || !strings.Contains(body, "Purged 2 of 2") {
		t.Fatalf("purge: %d\n%s", code, body)
	}
	snap = b.snapshot()
	if o, _, p := openIn(snap, "fp-b"); o != 0 || p != 2 {
		t.Errorf("fp-b after the purge: %d open, %d purged; want 0, 2", o, p)
	}
	if o, _, _ := openIn(snap, "fp-a2"); o != 1 {
		t.Errorf("fp-a2 after the purge: %d open, want 1", o)
	}
	audited = false
	for _, e := range snap.Events {
		audited = audited || (e.Kind == quarantine.EventPurged && e.By == "web" && e.Reason == "known bad" && len(e.IDs) == 2)
	}
	if !audited {
		t.Errorf("no purged event by web: %+v", snap.Events)
	}
}

// A payload over 64 KiB is cut, with a note; one that is not text is
// shown in base64.
func TestPageRecordShowsLargeAndBinaryPayloads(t *testing.T) {
	t.Parallel()
	b := setupPage(t)
	big := `{"id":"` + strings.Repeat("é", 50_000) + `"}` // 100,009 bytes; the cut falls inside a rune
	binary := "\x00\x01\xfe\xffnot text"
	b.quarantine(1, "big", "too big", func(int) string { return big }, nil)
	b.quarantine(1, "bin", "not text", func(int) string { return binary }, nil)
	b.keep(2)
	srv := b.server("")
	for _, r := range b.snapshot().Records {
		code, body := get(t, srv.URL+"/quarantine/record/"+r.ID)
		if code != http.StatusOK {
			t.Fatalf("GET record %s: %d", r.ID, code)
		}
		start := strings.Index(body, `<pre id="payload">`) + len(`<pre id="payload">`)
		shown := html.UnescapeString(body[start : start+strings.Index(body[start:], "</pre>")])
		switch r.Envelope.Fingerprint {
		case "big":
			if !strings.Contains(body, `id="truncated"`) || !strings.Contains(body, "100009 bytes as received") {
				t.Errorf("large payload: no truncation note")
			}
			if !utf8.ValidString(shown) || len(shown) > pagePayload || len(shown) < pagePayload-utf8.UTFMax || !strings.HasPrefix(shown, `{"id":"éé`) {
				t.Errorf("large payload shown: %d bytes, valid UTF-8 %v, starts %q", len(shown), utf8.ValidString(shown), shown[:min(len(shown), 40)])
			}
		case "bin":
			if !strings.Contains(body, "shown in base64") || shown != base64.StdEncoding.EncodeToString([]byte(binary)) {
				t.Errorf("binary payload shown as %q", shown)
			}
		}
	}
}
