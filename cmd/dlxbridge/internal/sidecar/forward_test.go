package sidecar

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/triage"
)

func testConfig(t *testing.T, forwardURL string, concurrency int) *config.Config {
	t.Helper()
	cfg := &config.Config{Queues: []config.Queue{{
		Name:     "orders",
		Exchange: config.Exchange{Name: "orders"},
		Consumer: config.Consumer{Concurrency: concurrency, HandlerTimeout: 5 * time.Second},
		Accepts:  []config.Accept{{Type: "orders.created", Versions: []string{"1"}}},
		Forward:  config.Forward{URL: forwardURL, Timeout: 2 * time.Second},
	}}}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func forwarder(t *testing.T, srvURL string, concurrency int) *Forwarder {
	t.Helper()
	cfg := testConfig(t, srvURL+"/orders?token=secret", concurrency)
	m, err := NewMetrics(prometheus.NewRegistry(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewForwarder(cfg, &cfg.Queues[0], m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

func message() *consumer.Message {
	return &consumer.Message{
		Queue: "orders", Type: "orders.created", Version: "1", OriginalVersion: "1",
		Body: []byte(`{"id":"o-1"}`), MessageID: "m-1", IdempotencyKey: "k-1", Attempt: 3,
	}
}

// Each answer class maps to the verdict the runtime carries out.
func TestForwardMapsAnswersToVerdicts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		status     int
		retryAfter string
		body       string
		class      triage.Class
		delay      time.Duration
		permanent  bool
		down       bool // a dependency signal for the queue's breaker
	}{
		{name: "200", status: 200},
		{name: "204", status: 204},
		{name: "429 with Retry-After", status: 429, retryAfter: "2", class: triage.ClassTransient, delay: 2 * time.Second, down: true},
		{name: "503 with Retry-After", status: 503, retryAfter: "7", class: triage.ClassTransient, delay: 7 * time.Second, down: true},
		{name: "429 without Retry-After", status: 429, class: triage.ClassTransient, down: true},
		{name: "503 with a bad Retry-After", status: 503, retryAfter: "soon", class: triage.ClassTransient, down: true},
		{name: "400", status: 400, body: "missing field customer", class: triage.ClassPermanent},
		{name: "404", status: 404, class: triage.ClassPermanent},
		{name: "422", status: 422, class: triage.ClassPermanent},
		{name: "302 is not followed", status: 302, class: triage.ClassPermanent},
		{name: "500", status: 500, body: "database down", class: triage.ClassTransient},
		{name: "502", status: 502, class: triage.ClassTransient},
		{name: "500 with Retry-After retries this message only", status: 500, retryAfter: "3", class: triage.ClassTransient, delay: 3 * time.Second},
		// The application's own credentials were revoked downstream: every
		// message would fail alike, so the queue pauses rather than
		// quarantining them all.
		{name: "401 pauses the queue", status: 401, class: triage.ClassTransient, down: true},
		{name: "403 pauses the queue", status: 403, retryAfter: "5", class: triage.ClassTransient, delay: 5 * time.Second, down: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.retryAfter != "" {
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				if tc.status == 302 {
					w.Header().Set("Location", "http://example.invalid/")
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			err := forwarder(t, srv.URL, 1).Handle(context.Background(), message())
			if tc.status/100 == 2 {
				if err != nil {
					t.Fatalf("got %v, want nil (ack)", err)
				}
				return
			}
			if err == nil {
				t.Fatal("got nil (ack), want an error")
			}
			class, delay := triage.Classify(err)
			if class != tc.class || delay != tc.delay {
				t.Errorf("classified %s after %s, want %s after %s (%v)", class, delay, tc.class, tc.delay, err)
			}
			if after, down := triage.IsDependencyDown(err); down != tc.down || down && after != tc.delay {
				t.Errorf("dependency signal %v after %s, want %v after %s", down, after, tc.down, tc.delay)
			}
			if tc.body != "" && !strings.Contains(err.Error(), tc.body) {
				t.Errorf("error %q lacks the endpoint's text %q", err, tc.body)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error %q quotes the URL's query", err)
			}
		})
	}
}

// forward.status overrides the defaults, a code before its class, and what
// it does not list keeps its default.
func TestForwardStatusOverridesTheDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(`queues:
  - name: orders
    exchange: {name: orders}
    consumer: {handler_timeout: 5s}
    accepts: [{type: orders.created, versions: ["1"]}]
    forward:
      url: "http://127.0.0.1:8080/x"
      status: {409: ack, 4xx: retry, "503": retry, 500: quarantine, 3xx: pause}
`))
	if err != nil {
		t.Fatal(err)
	}
	q := &cfg.Queues[0]
	for code, want := range map[int]config.ForwardAction{
		204: config.ForwardAck, 409: config.ForwardAck, 400: config.ForwardRetry, 401: config.ForwardRetry,
		503: config.ForwardRetry, 429: config.ForwardRetry, // what the queue writes wins, its class over a default code
		500: config.ForwardQuarantine, 502: config.ForwardRetry,
		302: config.ForwardPause, 101: config.ForwardQuarantine,
	} {
		if got := q.ForwardActionFor(code); got != want {
			t.Errorf("%d: %s, want %s", code, got, want)
		}
	}

	var code atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(code.Load()))
	}))
	defer srv.Close()
	q.Forward.URL = srv.URL
	f, err := NewForwarder(cfg, q, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	code.Store(409)
	if err := f.Handle(context.Background(), message()); err != nil {
		t.Errorf("409 mapped to ack: got %v, want nil", err)
	}
	code.Store(503)
	err = f.Handle(context.Background(), message())
	if c, _ := triage.Classify(err); c != triage.ClassTransient {
		t.Errorf("503 mapped to retry: classified %s (%v)", c, err)
	}
	if _, down := triage.IsDependencyDown(err); down {
		t.Errorf("503 mapped to retry still pauses the queue: %v", err)
	}
	code.Store(500)
	if c, _ := triage.Classify(f.Handle(context.Background(), message())); c != triage.ClassPermanent {
		t.Errorf("500 mapped to quarantine: classified %s", c)
	}
}

// A status key must be a code or class outside 2xx, and an action one of
// the four.
func TestForwardStatusIsChecked(t *testing.T) {
	t.Parallel()
	_, err := config.Parse([]byte(`queues:
  - name: orders
    exchange: {name: orders}
    consumer: {handler_timeout: 5s}
    accepts: [{type: orders.created, versions: ["1"]}]
    forward:
      url: "http://127.0.0.1:8080/x"
      status: {200: quarantine, 2xx: retry, 600: ack, 45: ack, 4x1: ack, " 500": ack, 404: drop, 418: ""}
`))
	for _, want := range []string{
		`queues[0].forward.status: "200": a 2xx response is always ack`,
		`queues[0].forward.status: "2xx": a 2xx response is always ack`,
		`queues[0].forward.status: "600" is not a status code`,
		`queues[0].forward.status: "45" is not a status code`,
		`queues[0].forward.status: "4x1" is not a status code`,
		`queues[0].forward.status: " 500" is not a status code`,
		`queues[0].forward.status.404: "drop" is not ack, retry, pause or quarantine`,
		`queues[0].forward.status.418: "" is not ack, retry, pause or quarantine`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want %q", err, want)
		}
	}
}

// No answer at all (refused, timed out) is transient; a refused connection
// is also a dependency signal for the queue's breaker (nothing listens at
// the endpoint), a timeout is not (it may be this message's).
func TestForwardWithoutAnAnswerIsTransient(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: refused
	err = forwarder(t, "http://"+addr, 1).Handle(context.Background(), message())
	if c, _ := triage.Classify(err); err == nil || c != triage.ClassTransient {
		t.Errorf("refused connection: %v classified %s, want transient", err, c)
	}
	if _, down := triage.IsDependencyDown(err); !down {
		t.Errorf("refused connection: %v is no dependency signal", err)
	}

	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	f := forwarder(t, srv.URL, 1)
	f.timeout = 100 * time.Millisecond
	err = f.Handle(context.Background(), message())
	if c, _ := triage.Classify(err); err == nil || c != triage.ClassTransient || !strings.Contains(err.Error(), "no answer within") {
		t.Errorf("timeout: %v classified %s, want transient 'no answer within'", err, c)
	}
	if _, down := triage.IsDependencyDown(err); down {
		t.Errorf("timeout: %v is a dependency signal, want a plain failure", err)
	}
}

// The request carries the body as received and the message's identity.
func TestForwardSendsBodyAndHeaders(t *testing.T) {
	t.Parallel()
	var got *http.Request
	var body string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := new(strings.Builder)
		_, _ = io.Copy(b, r.Body)
		got, body = r, b.String()
	}))
	defer srv.Close()
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: [16]byte{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:  [8]byte{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	if err := forwarder(t, srv.URL, 1).Handle(ctx, message()); err != nil {
		t.Fatal(err)
	}
	if got.Method != http.MethodPost || got.URL.Path != "/orders" || body != `{"id":"o-1"}` {
		t.Errorf("got %s %s %q", got.Method, got.URL.Path, body)
	}
	for k, want := range map[string]string{
		HeaderMessageType: "orders.created", HeaderSchemaVersion: "1", HeaderMessageID: "m-1",
		HeaderIdempotencyKey: "k-1", HeaderAttempt: "3", HeaderQueue: "orders", "Traceparent": tp,
		"Content-Type": "application/json",
	} {
		if v := got.Header.Get(k); v != want {
			t.Errorf("header %s = %q, want %q", k, v, want)
		}
	}
}

// A long or binary answer is cut to MaxErrorText bytes of valid UTF-8 on
// one line.
func TestForwardErrorTextIsBounded(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(500)
		_, _ = w.Write([]byte("line1\nline2 " + strings.Repeat("é", 4000) + "\xff"))
	}))
	defer srv.Close()
	err := forwarder(t, srv.URL, 1).Handle(context.Background(), message())
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.HasSuffix(msg, "…") || len(msg) > MaxErrorText+200 {
		t.Errorf("error text not bounded to one line: %d bytes: %q", len(msg), msg)
	}
	if !strings.Contains(msg, "line1 line2") {
		t.Errorf("error text lost the answer: %q", msg)
	}
}

// A slow endpoint gets at most the queue's concurrency in requests: extra
// callers wait for a connection, not a new one.
func TestForwardPoolMatchesConcurrency(t *testing.T) {
	t.Parallel()
	var inFlight, peak atomic.Int32
	release := make(chan struct{})
	arrived := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		arrived <- struct{}{}
		<-release
		inFlight.Add(-1)
	}))
	defer srv.Close()
	f := forwarder(t, srv.URL, 2)
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = f.Handle(context.Background(), message())
		}()
	}
	<-arrived
	<-arrived
	select {
	case <-arrived:
		t.Error("a third request reached the endpoint while two were in flight")
	case <-time.After(300 * time.Millisecond): // a negative: nothing more arrives
	}
	close(release)
	wg.Wait()
	if p := peak.Load(); p != 2 {
		t.Errorf("peak in flight %d, want 2", p)
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"2": 2 * time.Second, " 120 ": 2 * time.Minute, "0": 0, "-1": 0, "1.5": 0, "": 0, "soon": 0,
		"99999999999999": 0,
		now.Add(30 * time.Second).Format(http.TimeFormat): 30 * time.Second,
		now.Add(-time.Minute).Format(http.TimeFormat):     0,
	} {
		d, ok := parseRetryAfter(v, now)
		if d != want || ok != (want > 0) {
			t.Errorf("parseRetryAfter(%q) = %s, %v; want %s", v, d, ok, want)
		}
	}
}

// Forward URLs may name loopback or the configured hosts only.
func TestForwardHostsAreChecked(t *testing.T) {
	t.Parallel()
	for u, ok := range map[string]bool{
		"http://127.0.0.1:8080/x": true, "http://localhost/x": true, "http://[::1]:9/x": true,
		"http://127.9.9.9/x": true, "http://app.internal/x": true, "http://example.com/x": false,
		"http://10.0.0.1/x": false, "ftp://127.0.0.1/x": false, "http://u:p@127.0.0.1/x": false,
	} {
		cfg := &config.Config{Run: config.Run{ForwardHosts: []string{"app.internal"}}, Queues: []config.Queue{{
			Name: "orders", Exchange: config.Exchange{Name: "orders"},
			Accepts: []config.Accept{{Type: "orders.created", Versions: []string{"1"}}},
			Forward: config.Forward{URL: u},
		}}}
		err := cfg.Complete()
		if (err == nil) != ok {
			t.Errorf("%s: Complete() = %v, want ok=%v", u, err, ok)
		}
	}
}

// run's keys are checked with the paths of the fields.
func TestRunKeysAreChecked(t *testing.T) {
	t.Parallel()
	_, err := config.Parse([]byte(`run: {listen: "9180", forward_hosts: ["a/b"]}
queues:
  - name: orders
    exchange: {name: orders}
    consumer: {handler_timeout: 5s}
    accepts: [{type: orders.created, versions: ["1"]}]
    forward: {url: "http://127.0.0.1:8080/x", timeout: 6s}
`))
	for _, want := range []string{
		`run.listen: "9180" is not host:port`,
		`run.forward_hosts[0]: "a/b" is not a host name or IP address`,
		`queues[0].forward.timeout: must be <= consumer.handler_timeout (5s)`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want %q", err, want)
		}
	}
	cfg, err := config.Parse([]byte(`queues:
  - name: orders
    exchange: {name: orders}
    consumer: {handler_timeout: 7s}
    accepts: [{type: orders.created, versions: ["1"]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Run.Listen != config.DefaultListen || cfg.Queues[0].ForwardTimeout() != 7*time.Second {
		t.Errorf("defaults: listen %q, forward.timeout %s", cfg.Run.Listen, cfg.Queues[0].ForwardTimeout())
	}
}

// An endpoint that answers 101 Switching Protocols and then goes quiet
// gets the forward timeout like any other: the 101's body is the raw
// connection, which the transport does not close when the request's
// context ends.
func TestForwardTimeoutBoundsASwitchedConnection(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	release := make(chan struct{})
	defer close(release)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		_, _ = c.Read(buf) // the request (small, one read)
		_, _ = c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: quiet\r\n\r\n"))
		<-release
	}()
	f := forwarder(t, "http://"+ln.Addr().String(), 1)
	f.timeout = 200 * time.Millisecond
	done := make(chan error, 1)
	go func() { done <- f.Handle(context.Background(), message()) }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("101 acked, want an error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Handle still waits on a 101's connection 5s after its 200ms timeout")
	}
}

// A producer's message id, idempotency key or correlation id with a
// control character cannot become an HTTP header: the request is never
// sent (no header injection), and the failure is permanent, not a
// transient one retried until the attempts run out.
func TestForwardRefusesControlCharactersInHeadersPermanently(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer srv.Close()
	f := forwarder(t, srv.URL, 1)
	refusedPermanently(t, f, map[string]func(m *consumer.Message){
		"idempotency key with CRLF": func(m *consumer.Message) { m.IdempotencyKey = "k\r\nX-Injected: 1" },
		"message id with NUL":       func(m *consumer.Message) { m.MessageID = "m\x00" },
		"correlation id with LF":    func(m *consumer.Message) { m.CorrelationID = "c\n" },
	})
	m := message()
	m.IdempotencyKey = "k\tü" // a tab and non-ASCII bytes are valid field values
	if err := f.Handle(context.Background(), m); err != nil {
		t.Errorf("tab and UTF-8 in a header: %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("endpoint called %d times, want 1 (the valid message only)", n)
	}
}

// Under gate off or report the type and version are a producer's too (no
// schema lookup vouches for them): a control character in either is
// refused at once, not retried until the budget runs out.
func TestForwardRefusesControlCharactersInTypeAndVersion(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer srv.Close()
	f := forwarder(t, srv.URL, 1)
	refusedPermanently(t, f, map[string]func(m *consumer.Message){
		"version with CRLF": func(m *consumer.Message) { m.Version = "1\r\nX-Injected: 1" },
		"type with LF":      func(m *consumer.Message) { m.Type = "orders\n" },
	})
	if n := calls.Load(); n != 0 {
		t.Errorf("endpoint called %d times, want 0", n)
	}
}

// refusedPermanently forwards a message changed by each of set and wants
// a permanent failure that names the control character.
func refusedPermanently(t *testing.T, f *Forwarder, set map[string]func(m *consumer.Message)) {
	t.Helper()
	for name, change := range set {
		m := message()
		change(m)
		err := f.Handle(context.Background(), m)
		if c, _ := triage.Classify(err); c != triage.ClassPermanent || !strings.Contains(err.Error(), "control character") {
			t.Errorf("%s: %v classified %q, want permanent naming the control character", name, err, c)
		}
	}
}
