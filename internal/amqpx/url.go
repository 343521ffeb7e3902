// Package amqpx is dlxbridge's AMQP plumbing: dialing named connections,
// keeping passwords out of errors, and the one confirm+mandatory publisher
// every component uses. amqp091-go's Notify* channels are created and
// drained only here.
package amqpx

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultURL is the broker URL when neither --url nor RABBITMQ_URL is given.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// Passwords are kept out of errors by structure, not by pattern: a URL is
// parsed once, and every message about it is built from the parsed parts
// that are safe to show (Endpoint). Errors from url.Parse, amqp.ParseURI
// and amqp.DialConfig quote the URL or a fragment of it (`invalid port
// ":s3cr3t" after host` for a password with '#', '/' or '?'), so they are
// never passed on as text.

// URLError is a URL that cannot be used. Its text says what is wrong and
// quotes nothing of the URL.
type URLError struct {
	// Kind names the URL, e.g. "AMQP URL" or "management URL".
	Kind string
	// Reason says what is wrong, without any of the URL's text.
	Reason string
}

func (e *URLError) Error() string { return "invalid " + e.Kind + " (" + e.Reason + ")" }

// encodeHint is the usual cause of a URL that does not parse.
const encodeHint = "percent-encode any '#', '/', '?', '@', '%' or ':' in the user name or password, e.g. '#' as %23"

// ParseURL parses raw as a URL of the given kind (see URLError.Kind). Its
// error never quotes raw. Besides url.Parse's own checks it refuses what a
// password that was not percent-encoded leaves behind when it does parse:
// a fragment, or an '@' in the path or query (the userinfo spilled past the
// host, and a piece of the password now reads as the port or the vhost).
func ParseURL(kind, raw string) (*url.URL, error) {
	bad := func(reason string) (*url.URL, error) { return nil, &URLError{Kind: kind, Reason: reason} }
	if raw == "" {
		return bad("empty")
	}
	if strings.ContainsAny(raw, " \t\r\n") {
		return bad("contains whitespace")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return bad(parseReason(err))
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return bad("contains '#': " + encodeHint)
	}
	if strings.Contains(u.EscapedPath(), "@") || strings.Contains(u.RawQuery, "@") {
		return bad("an '@' after the host: " + encodeHint)
	}
	if u.Opaque != "" {
		return bad("no '//' after the scheme; want scheme://[user[:password]@]host[:port]/...")
	}
	return u, nil
}

// parseReason describes a url.Parse error without its text, which quotes
// the URL or the piece that failed.
func parseReason(err error) string {
	var esc url.EscapeError
	var host url.InvalidHostError
	inner := err
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		inner = ue.Err
	}
	msg := inner.Error()
	switch {
	case errors.As(err, &esc):
		return "a '%' not followed by two hex digits: " + encodeHint
	case errors.As(err, &host):
		return "the host is not valid: " + encodeHint
	case strings.HasPrefix(msg, "invalid port"):
		return "the host's port is not a number: " + encodeHint
	case strings.Contains(msg, "missing protocol scheme"), strings.Contains(msg, "first path segment"):
		return "no scheme"
	case strings.Contains(msg, "control character"):
		return "contains a control character"
	default:
		return "does not parse as a URL: " + encodeHint
	}
}

// Endpoint is what can be shown of an AMQP URL: everything but the
// password.
type Endpoint struct {
	Scheme, User, Host string
	Port               int
	Vhost              string
}

// String is scheme://user@host:port/vhost (the vhost "/" as a bare "/",
// others path-escaped).
func (e Endpoint) String() string {
	var b strings.Builder
	b.WriteString(e.Scheme + "://")
	if e.User != "" {
		b.WriteString(url.PathEscape(e.User) + "@")
	}
	b.WriteString(net.JoinHostPort(e.Host, strconv.Itoa(e.Port)) + "/")
	if e.Vhost != "/" {
		b.WriteString(url.PathEscape(e.Vhost))
	}
	return b.String()
}

// ParseAMQPURL checks raw the way amqp091-go will read it (scheme, port,
// query parameters, defaults for user and vhost) and returns what can be
// shown of it. The error is a *URLError that quotes nothing of raw.
func ParseAMQPURL(raw string) (Endpoint, error) {
	bad := func(reason string) (Endpoint, error) {
		return Endpoint{}, &URLError{Kind: "AMQP URL", Reason: reason}
	}
	u, err := ParseURL("AMQP URL", raw)
	if err != nil {
		return Endpoint{}, err
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return bad("the scheme must be amqp or amqps")
	}
	for _, m := range u.Query()["auth_mechanism"] {
		switch strings.ToUpper(m) {
		case "PLAIN", "AMQPLAIN", "EXTERNAL":
		default:
			return bad("auth_mechanism must be plain, amqplain or external")
		}
	}
	uri, err := amqp.ParseURI(raw)
	if err != nil {
		return bad("a port or a query parameter (heartbeat, connection_timeout, channel_max) is not a valid number")
	}
	if uri.Port < 1 || uri.Port > 65535 {
		return bad("the port is out of range")
	}
	if strings.Contains(uri.Host, ",") {
		// "amqp://h1:5672,h2:5672/" parses, as host "h1:5672,h2".
		return bad("the host has a comma in it")
	}
	return Endpoint{Scheme: uri.Scheme, User: uri.Username, Host: uri.Host, Port: uri.Port, Vhost: uri.Vhost}, nil
}

// DialError is a failed connection attempt to a URL that parsed. Its text
// names the endpoint (never the password) and what went wrong.
type DialError struct {
	Endpoint Endpoint
	// Err is amqp091-go's error: a *amqp.Error such as amqp.ErrCredentials
	// or amqp.ErrVhost, or a network error. Once the URL has parsed it
	// quotes nothing of it.
	Err error
}

func (e *DialError) Error() string {
	var why string
	switch {
	case errors.Is(e.Err, amqp.ErrCredentials):
		why = fmt.Sprintf("the broker refused the login of user %q (wrong user name or password?)", e.Endpoint.User)
	case errors.Is(e.Err, amqp.ErrVhost):
		why = fmt.Sprintf("user %q may not open vhost %q (it does not exist, or the user has no access to it)", e.Endpoint.User, e.Endpoint.Vhost)
	case errors.Is(e.Err, amqp.ErrSASL):
		why = "the broker offers none of the authentication mechanisms the URL asks for"
	default:
		why = e.Err.Error()
	}
	return "connect to " + e.Endpoint.String() + ": " + why
}

func (e *DialError) Unwrap() error { return e.Err }

// tlsConfig is the TLS configuration amqp091-go derives from an amqps URL
// (its tlsConfigFromURI): the URL's CA file, else the system's roots; its
// client certificate and key, if both are given; its server name, else the
// host.
func tlsConfig(uri amqp.URI) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: uri.ServerName}
	if cfg.ServerName == "" {
		cfg.ServerName = uri.Host
	}
	if uri.CACertFile != "" {
		data, err := os.ReadFile(uri.CACertFile)
		if err != nil {
			return nil, fmt.Errorf("read CA certificate: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		cfg.RootCAs.AppendCertsFromPEM(data)
	}
	if uri.CertFile != "" && uri.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(uri.CertFile, uri.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// IsPermanent says whether err, from Dial or from setting up a consumer,
// will fail the same way on the next try: a URL that does not parse, a
// login or vhost the broker refuses, or a channel closed with 403
// ACCESS_REFUSED, 404 NOT_FOUND (e.g. a missing queue) or 530 NOT_ALLOWED.
// Anything else (refused or reset connections, a broker restarting, a
// forced close) is transient.
func IsPermanent(err error) bool {
	var ue *URLError
	if errors.As(err, &ue) {
		return true
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.Code {
	case amqp.AccessRefused, amqp.NotAllowed:
		return true
	case amqp.NotFound:
		// A cluster whose node holding a classic queue is down says 404
		// too, and that one passes.
		return !strings.Contains(ae.Reason, "down or inaccessible")
	}
	return false
}
