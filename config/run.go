package config

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Run configures `dlxbridge run`: the sidecar that consumes the work queues
// and forwards each validated message to a local HTTP endpoint per queue.
// A program that uses the consumer package directly ignores it.
type Run struct {
	// Listen is the address of the sidecar's own HTTP server (/metrics,
	// /healthz, /readyz). Defaults to "127.0.0.1:9180".
	Listen string `yaml:"listen"`

	// ForwardHosts are host names or IP addresses, besides loopback, that a
	// queue's forward.url may name. The sidecar forwards messages, bodies as
	// received, to the URLs in this file; limiting them to loopback (where
	// a sidecar's application listens) and hosts named here keeps a config
	// mistake from sending payloads across the network. Hosts are compared
	// as written, without DNS. Defaults to none (loopback only: 127.0.0.0/8,
	// ::1 and "localhost").
	ForwardHosts []string `yaml:"forward_hosts"`

	// OperatorTokenEnv names the environment variable holding the token
	// that lets the quarantine page (/quarantine) replay and purge: at
	// least 16 bytes, not counting spaces around it. The token itself
	// never goes in this file. Defaults to "" (the page is read-only).
	OperatorTokenEnv string `yaml:"operator_token_env"`

	// AllowedHosts are Host header values, besides the address the page
	// is reached on (and localhost on a loopback address), that the
	// quarantine page answers: "host:port", or "host" for any port. A page
	// answering any name could be read through an operator's browser by a
	// site whose name resolves to the sidecar (DNS rebinding). Defaults to
	// none.
	AllowedHosts []string `yaml:"allowed_hosts"`
}

// Forward is where `dlxbridge run` POSTs one queue's validated messages.
type Forward struct {
	// URL is the endpoint, http(s), on loopback or a host listed in
	// run.forward_hosts. Required by `dlxbridge run`; ignored otherwise.
	// Defaults to "".
	URL string `yaml:"url"`

	// Timeout bounds one request, response body included; running out is a
	// transient failure. At most consumer.handler_timeout. Defaults to
	// consumer.handler_timeout (0 here; see Queue.ForwardTimeout).
	Timeout time.Duration `yaml:"timeout"`

	// Status says what an answer means, by code ("409") or class ("4xx"):
	// ack, retry, pause or quarantine. A code wins over its class; what is
	// not listed follows the defaults (ForwardActionFor). 2xx is always
	// ack.
	Status map[string]ForwardAction `yaml:"status"`
}

// ForwardAction is what `dlxbridge run` does with a message whose forwarded
// answer had a given status.
type ForwardAction string

const (
	// ForwardAck settles the message as handled.
	ForwardAck ForwardAction = "ack"
	// ForwardRetry retries this message with backoff (after the answer's
	// Retry-After, if it gives one); the queue keeps consuming.
	ForwardRetry ForwardAction = "retry"
	// ForwardPause says the application's dependency is down: the queue's
	// circuit breaker pauses consumption (for the Retry-After, if given)
	// and this message is retried after it.
	ForwardPause ForwardAction = "pause"
	// ForwardQuarantine parks the message now, as a permanent failure.
	ForwardQuarantine ForwardAction = "quarantine"
)

// defaultForwardStatus is what answers mean when forward.status does not
// say. 429 and 503 mean "my dependency is down", so they pause the queue;
// 401 and 403 pause it too, because an application whose own credentials
// were revoked fails every message alike, and pausing keeps them all where
// quarantining would park them all. 500 and the rest of 5xx retry this
// message; other answers (1xx, 3xx, 4xx) quarantine it.
var defaultForwardStatus = map[string]ForwardAction{
	"429": ForwardPause,
	"503": ForwardPause,
	"401": ForwardPause,
	"403": ForwardPause,
	"5xx": ForwardRetry,
	"1xx": ForwardQuarantine,
	"3xx": ForwardQuarantine,
	"4xx": ForwardQuarantine,
}

// ForwardActionFor is what an answer with status code means for q: the
// queue's forward.status for the code, else for its class, else the
// default for the code, else for its class. 2xx is ack. The defaults: 429
// and 503 pause, and so do 401 and 403; other 5xx retry; 1xx, 3xx and other
// 4xx quarantine. A code outside 100–599, which forward.status cannot name,
// retries.
func (q *Queue) ForwardActionFor(code int) ForwardAction {
	if code >= 200 && code < 300 {
		return ForwardAck
	}
	if code < 100 || code > 599 {
		// No HTTP status (a broken endpoint or proxy): nothing says the
		// message is bad, and quarantining would park every message
		// while it lasts.
		return ForwardRetry
	}
	exact, class := strconv.Itoa(code), fmt.Sprintf("%dxx", code/100)
	for _, m := range []map[string]ForwardAction{q.Forward.Status, defaultForwardStatus} {
		if a, ok := m[exact]; ok {
			return a
		}
		if a, ok := m[class]; ok {
			return a
		}
	}
	return ForwardQuarantine
}

// forwardStatusKey reports whether k names a non-2xx status code (100–599)
// or class ("1xx", "3xx" … "5xx").
func forwardStatusKey(k string) bool {
	if len(k) != 3 || k[0] < '1' || k[0] > '5' || k[0] == '2' {
		return false
	}
	if k[1:] == "xx" {
		return true
	}
	return k[1] >= '0' && k[1] <= '9' && k[2] >= '0' && k[2] <= '9'
}

// ForwardTimeout is the timeout of one forwarded request: forward.timeout,
// else consumer.handler_timeout. It is computed, not stored, so a config
// completed once and then given a shorter handler timeout stays valid.
func (q *Queue) ForwardTimeout() time.Duration {
	if q.Forward.Timeout > 0 {
		return q.Forward.Timeout
	}
	return q.Consumer.HandlerTimeout
}

// DefaultListen is run.listen's default.
const DefaultListen = "127.0.0.1:9180"

func (c *Config) applyRunDefaults() {
	if c.Run.Listen == "" {
		c.Run.Listen = DefaultListen
	}
}

func (c *Config) validateRun(add func(path, format string, args ...any)) {
	if _, _, err := net.SplitHostPort(c.Run.Listen); err != nil {
		add("run.listen", "%q is not host:port", c.Run.Listen)
	}
	for i, h := range c.Run.ForwardHosts {
		if h == "" || strings.ContainsAny(h, "/:@ ") && net.ParseIP(h) == nil {
			add(fmt.Sprintf("run.forward_hosts[%d]", i), "%q is not a host name or IP address", h)
		}
	}
	for i, h := range c.Run.AllowedHosts {
		host := h
		if hh, port, err := net.SplitHostPort(h); err == nil {
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				host = ""
			} else {
				host = hh
			}
		}
		if host == "" || strings.ContainsAny(host, "/@ []") && net.ParseIP(host) == nil || strings.Contains(host, ":") && net.ParseIP(host) == nil {
			add(fmt.Sprintf("run.allowed_hosts[%d]", i), "%q is not a host or host:port (write an IPv6 address with a port as [::1]:9180)", h)
		}
	}
	for i := range c.Queues {
		q := &c.Queues[i]
		p := fmt.Sprintf("queues[%d].forward", i)
		if q.Forward.Timeout < 0 {
			add(p+".timeout", "must be > 0")
		} else if q.Consumer.HandlerTimeout > 0 && q.Forward.Timeout > q.Consumer.HandlerTimeout {
			add(p+".timeout", "must be <= consumer.handler_timeout (%s)", q.Consumer.HandlerTimeout)
		}
		for _, k := range slices.Sorted(maps.Keys(q.Forward.Status)) {
			switch a := q.Forward.Status[k]; {
			case len(k) == 3 && k[0] == '2' && forwardStatusKey("4"+k[1:]):
				add(p+".status", "%q: a 2xx response is always ack and cannot be mapped", k)
			case !forwardStatusKey(k):
				add(p+".status", "%q is not a status code (100–599) or class (4xx)", k)
			case a != ForwardAck && a != ForwardRetry && a != ForwardPause && a != ForwardQuarantine:
				add(p+".status."+k, "%q is not ack, retry, pause or quarantine", string(a))
			}
		}
		if q.Forward.URL == "" {
			continue
		}
		u, err := url.Parse(q.Forward.URL)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			add(p+".url", "must be an http(s) URL such as http://127.0.0.1:8080/orders")
		case u.User != nil:
			add(p+".url", "must not carry credentials")
		case !c.ForwardHostAllowed(u.Hostname()):
			add(p+".url", "host %q is neither loopback nor listed in run.forward_hosts", u.Hostname())
		}
	}
}

// ForwardHostAllowed reports whether forward URLs may name host: a loopback
// address, "localhost", or a host listed in run.forward_hosts (compared
// case-insensitively, without DNS).
func (c *Config) ForwardHostAllowed(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, h := range c.Run.ForwardHosts {
		if strings.EqualFold(h, host) {
			return true
		}
	}
	return false
}
