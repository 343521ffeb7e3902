package config

import (
	"fmt"
	"net"
	"net/url"
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
