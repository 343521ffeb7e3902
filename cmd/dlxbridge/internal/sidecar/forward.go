// Package sidecar is `dlxbridge run`: the runtime as a sidecar for consumers
// written in any language. It forwards every validated message of a queue to
// a local HTTP endpoint and turns the answer into the runtime's verdicts; it
// serves /metrics, /healthz and /readyz; and it exports gauges read from the
// broker's management API.
//
// It uses the consumer package only through its public API: a Forwarder is
// a consumer.Handler.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Headers a forwarded request carries besides Content-Type and the W3C
// trace context (traceparent, tracestate).
const (
	HeaderMessageType    = "Dlxbridge-Message-Type"
	HeaderSchemaVersion  = "Dlxbridge-Schema-Version"
	HeaderMessageID      = "Dlxbridge-Message-Id"
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderAttempt        = "Dlxbridge-Attempt"
	HeaderQueue          = "Dlxbridge-Queue"
	HeaderCorrelationID  = "Dlxbridge-Correlation-Id"
)

// MaxErrorText bounds how much of an endpoint's answer goes into the error
// (and so into the retry header and the quarantine envelope).
const MaxErrorText = 512

// Forwarder POSTs one queue's validated messages to its forward.url. Its
// connection pool holds at most the queue's concurrency, which is also how
// many handlers the runtime runs at once: a slow endpoint holds the workers,
// the prefetch fills, and the broker stops delivering. Nothing queues up in
// the sidecar.
type Forwarder struct {
	queue   string
	url     string
	target  string // scheme://host/path, for errors (no query: it may carry secrets)
	timeout time.Duration
	action  func(code int) config.ForwardAction
	client  *http.Client
	metrics *Metrics
}

// NewForwarder builds the forwarder of q (a queue of a completed config
// whose forward.url is set). m may be nil.
func NewForwarder(cfg *config.Config, q *config.Queue, m *Metrics) (*Forwarder, error) {
	if q.Forward.URL == "" {
		return nil, fmt.Errorf("queues[%s].forward.url is required by dlxbridge run", q.Name)
	}
	u, err := url.Parse(q.Forward.URL)
	if err != nil || !cfg.ForwardHostAllowed(u.Hostname()) {
		return nil, fmt.Errorf("queue %q: forward.url is not allowed (loopback or run.forward_hosts only)", q.Name)
	}
	transport := &http.Transport{
		Proxy:               nil, // never through an environment proxy: the endpoint is local
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxConnsPerHost:     q.Consumer.Concurrency,
		MaxIdleConnsPerHost: q.Consumer.Concurrency,
		MaxIdleConns:        q.Consumer.Concurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &Forwarder{
		queue:   q.Name,
		url:     q.Forward.URL,
		target:  (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String(),
		timeout: q.ForwardTimeout(),
		action:  q.ForwardActionFor,
		client: &http.Client{
			Transport: transport,
			// A redirect could lead off the allowed hosts: the answer is
			// the 3xx itself.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		metrics: m,
	}, nil
}

// Close drops idle connections.
func (f *Forwarder) Close() { f.client.CloseIdleConnections() }

// Handle forwards m and maps the answer to a verdict by the queue's
// forward.status (config.Queue.ForwardActionFor):
//   - ack: nil;
//   - pause (by default 429, 503, 401, 403): triage.DependencyDown with the
//     Retry-After (seconds or an HTTP date) if given: the queue's circuit
//     breaker pauses consumption for that long (without one, for its own
//     backoff), and the message is retried after it (docs/breaker.md);
//   - retry (by default the other 5xx): a transient error, retried with
//     backoff, or after the Retry-After if given;
//   - quarantine (by default 1xx, 3xx and the other 4xx; redirects are not
//     followed): triage.Permanent, quarantined now.
//
// A refused connection is a pause without a Retry-After (nothing listens at
// the endpoint); a timeout or a reset connection is a retry.
//
// Errors name the endpoint without its query and carry at most MaxErrorText
// bytes of the answer.
func (f *Forwarder) Handle(ctx context.Context, m *consumer.Message) error {
	start := time.Now()
	status, err := f.forward(ctx, m)
	if f.metrics != nil {
		f.metrics.observe(f.queue, status, time.Since(start))
	}
	return err
}

func (f *Forwarder) forward(ctx context.Context, m *consumer.Message) (status int, err error) {
	rctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, f.url, strings.NewReader(string(m.Body)))
	if err != nil {
		return 0, triage.Permanent(fmt.Errorf("forward to %s: %w", f.target, errors.Unwrap(err)))
	}
	// Producers set these (the type and version too, under gate off or
	// report, where no schema lookup checks them): a control character (CR,
	// LF, NUL) cannot go into an HTTP header, and the transport would
	// refuse the request on every attempt. No retry can fix it, so it is
	// permanent, and says why.
	for k, v := range map[string]string{HeaderMessageID: m.MessageID, HeaderIdempotencyKey: m.IdempotencyKey, HeaderCorrelationID: m.CorrelationID, HeaderMessageType: m.Type, HeaderSchemaVersion: m.Version} {
		if !validHeaderValue(v) {
			return 0, triage.Permanent(fmt.Errorf("forward to %s: the message's %s holds a control character, which an HTTP header cannot carry", f.target, k))
		}
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set(HeaderMessageType, m.Type)
	h.Set(HeaderSchemaVersion, m.Version)
	h.Set(HeaderQueue, m.Queue)
	h.Set(HeaderAttempt, strconv.Itoa(m.Attempt))
	setIf(h, HeaderMessageID, m.MessageID)
	setIf(h, HeaderIdempotencyKey, m.IdempotencyKey)
	setIf(h, HeaderCorrelationID, m.CorrelationID)
	telemetry.Propagator.Inject(ctx, headerCarrier(h))

	resp, err := f.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // a *url.Error quotes the whole URL
		}
		if rctx.Err() != nil && ctx.Err() == nil {
			return 0, fmt.Errorf("forward to %s: no answer within %s", f.target, f.timeout)
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			// Nothing listens at the endpoint: it is down (or not up
			// yet), whatever the message. A dependency signal, as 503
			// without Retry-After, or the breaker would never open on
			// the most common outage with its default (signals-only)
			// settings.
			return 0, triage.DependencyDown(0, fmt.Errorf("forward to %s: %w", f.target, err))
		}
		return 0, fmt.Errorf("forward to %s: %w", f.target, err)
	}
	defer resp.Body.Close()
	// The timeout bounds the body too. The transport ends a body read when
	// rctx ends, except a 101's, which is the raw connection: an endpoint
	// that switches protocols and goes quiet would hold the worker (and
	// its concurrency slot) forever.
	stop := context.AfterFunc(rctx, func() { _ = resp.Body.Close() })
	defer stop()
	text, _ := io.ReadAll(io.LimitReader(resp.Body, MaxErrorText+utf8.UTFMax))
	// Read a little more so the connection can be reused; not a whole
	// large body.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))

	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return code, nil
	}
	answer := fmt.Errorf("forward to %s: %s%s", f.target, resp.Status, quote(text))
	d, _ := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	switch f.action(code) {
	case config.ForwardAck:
		return code, nil
	case config.ForwardPause:
		// The endpoint says it (or what it depends on) is down, not that
		// this message is bad: pausing the queue keeps the messages still
		// queued untouched until it is back.
		return code, triage.DependencyDown(d, answer)
	case config.ForwardRetry:
		if d > 0 {
			return code, triage.RetryAfter(d, answer)
		}
		return code, answer
	default:
		return code, triage.Permanent(answer)
	}
}

// validHeaderValue reports whether v can be an HTTP field value as sent:
// no control characters but horizontal tab (RFC 9110, section 5.5).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; b < 0x20 && b != '\t' || b == 0x7f {
			return false
		}
	}
	return true
}

func setIf(h http.Header, k, v string) {
	if v != "" {
		h.Set(k, v)
	}
}

// quote renders an answer's text for an error: valid UTF-8, one line, at
// most MaxErrorText bytes, "…" if it was cut. b holds up to
// MaxErrorText+utf8.UTFMax bytes of the answer.
func quote(b []byte) string {
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	cut := len(s) > MaxErrorText
	if cut {
		i := MaxErrorText
		for i > 0 && !utf8.RuneStart(s[i]) {
			i--
		}
		s = s[:i]
	}
	s = strings.TrimSpace(strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s))
	if s == "" {
		return ""
	}
	if cut {
		s += "…"
	}
	return ": " + s
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date.
// A negative, absurd or unreadable value is no hint.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		if n == 0 {
			return 0, false
		}
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d, true
		}
	}
	return 0, false
}

// headerCarrier lets the W3C propagator write into an http.Header with the
// lower-case names the standard uses.
type headerCarrier http.Header

func (c headerCarrier) Get(key string) string { return http.Header(c).Get(key) }
func (c headerCarrier) Set(key, value string) { c[key] = []string{value} }
func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
