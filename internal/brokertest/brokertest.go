// Package brokertest gives every integration test a real RabbitMQ broker, a
// unique name prefix, named connections and cleanup of what it declared.
//
// The broker is found once per test binary:
//  1. RABBITMQ_URL, if set (RABBITMQ_MANAGEMENT_URL optionally names the
//     management API; otherwise http://<host>:15672 is probed);
//  2. otherwise a testcontainers-go rabbitmq:4-management container, where a
//     Docker engine answers;
//  3. otherwise the test is skipped with the reason, except under CI=true,
//     where a missing broker fails the test: CI must never go green by
//     skipping.
//
// It imports nothing of dlxbridge but internal/amqpx, so any package's
// tests can use it.
package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// Env is one test's slice of the broker.
type Env struct {
	T testing.TB
	// URL is the AMQP URL (with credentials).
	URL string
	// ManagementURL is the management API base URL, or "" if none answers.
	ManagementURL string
	// ServerVersion is the broker's version string, e.g. "3.10.8".
	ServerVersion string
	// Prefix is unique to this test; every name it declares should start
	// with it (use Name).
	Prefix string

	mu        sync.Mutex
	queues    []string
	exchanges []string
}

type broker struct {
	url, mgmt string
	skip      string
	err       error
}

var (
	once   sync.Once
	shared broker
)

func find() broker {
	once.Do(func() { shared = locate() })
	return shared
}

func locate() broker {
	if u := os.Getenv("RABBITMQ_URL"); u != "" {
		b := broker{url: u, mgmt: os.Getenv("RABBITMQ_MANAGEMENT_URL")}
		if b.mgmt == "" {
			b.mgmt = probeManagement(u)
		}
		return b
	}
	return startContainer()
}

// probeManagement guesses http://<amqp host>:15672 and keeps it if it answers.
func probeManagement(amqpURL string) string {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return ""
	}
	m := "http://" + u.Hostname() + ":15672"
	req, _ := http.NewRequest(http.MethodGet, m+"/api/overview", nil)
	user, pass := "guest", "guest"
	if u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
	}
	req.SetBasicAuth(user, pass)
	resp, err := (&http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return ""
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return m
}

// Require returns an Env or skips (fails under CI=true) when there is no
// broker.
func Require(t testing.TB) *Env {
	t.Helper()
	b := find()
	if b.url == "" {
		reason := b.skip
		if b.err != nil {
			reason = b.err.Error()
		}
		if os.Getenv("CI") == "true" {
			t.Fatalf("no RabbitMQ broker under CI=true (set RABBITMQ_URL): %s", reason)
		}
		t.Skipf("no RabbitMQ broker: %s (set RABBITMQ_URL to run this test)", reason)
	}
	e := &Env{T: t, URL: b.url, ManagementURL: b.mgmt, Prefix: prefixFor(t.Name())}
	conn := e.Dial("probe")
	if v, ok := conn.Properties["version"].(string); ok {
		e.ServerVersion = v
	}
	t.Cleanup(e.cleanup)
	return e
}

var unsafe = regexp.MustCompile(`[^A-Za-z0-9]+`)

func prefixFor(name string) string {
	s := strings.Trim(unsafe.ReplaceAllString(strings.ToLower(name), "-"), "-")
	if len(s) > 40 {
		s = s[:40]
	}
	var r [3]byte
	_, _ = rand.Read(r[:])
	return "t-" + s + "-" + hex.EncodeToString(r[:])
}

// Name returns Prefix + "." + s.
func (e *Env) Name(s string) string { return e.Prefix + "." + s }

// Dial opens a connection named "<prefix>/<purpose>" that is closed at the
// end of the test.
func (e *Env) Dial(purpose string) *amqp.Connection {
	e.T.Helper()
	conn, err := amqpx.Dial(e.URL, e.Prefix+"/"+purpose)
	if err != nil {
		e.T.Fatalf("dial broker: %v", err)
	}
	e.T.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Channel opens a channel on a fresh named connection.
func (e *Env) Channel(purpose string) *amqp.Channel {
	e.T.Helper()
	ch, err := e.Dial(purpose).Channel()
	if err != nil {
		e.T.Fatalf("open channel: %v", err)
	}
	return ch
}

// TrackQueue and TrackExchange register names to delete at cleanup, for names
// that don't start with Prefix.
func (e *Env) TrackQueue(name string) {
	e.mu.Lock()
	e.queues = append(e.queues, name)
	e.mu.Unlock()
}

// TrackExchange registers an exchange to delete at cleanup.
func (e *Env) TrackExchange(name string) {
	e.mu.Lock()
	e.exchanges = append(e.exchanges, name)
	e.mu.Unlock()
}

// cleanup deletes tracked names and, where the management API answers,
// every queue and exchange whose name starts with Prefix.
func (e *Env) cleanup() {
	conn, err := amqpx.Dial(e.URL, e.Prefix+"/cleanup")
	if err != nil {
		e.T.Logf("cleanup: dial: %v", err)
		return
	}
	defer conn.Close()
	e.mu.Lock()
	queues := append([]string(nil), e.queues...)
	exchanges := append([]string(nil), e.exchanges...)
	e.mu.Unlock()
	if e.ManagementURL != "" {
		q, x, err := e.listPrefixed()
		if err != nil {
			e.T.Logf("cleanup: management listing: %v", err)
		}
		queues = append(queues, q...)
		exchanges = append(exchanges, x...)
	}
	for _, q := range queues {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(q, false, false, false)
		_ = ch.Close()
	}
	for _, x := range exchanges {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_ = ch.ExchangeDelete(x, false, false)
		_ = ch.Close()
	}
}

// ManagementGet performs an authenticated GET on the management API and
// returns the body; the test fails if it does not answer 200.
func (e *Env) ManagementGet(path string) []byte {
	e.T.Helper()
	body, err := e.mgmtGet(path)
	if err != nil {
		e.T.Fatalf("management GET %s: %v", path, err)
	}
	return body
}

func (e *Env) mgmtGet(path string) ([]byte, error) {
	return e.mgmtDo(http.MethodGet, path, http.StatusOK)
}

// mgmtDo sends an authenticated request (credentials from the AMQP URL) and
// returns the body; a status other than want is an error.
func (e *Env) mgmtDo(method, path string, want int) ([]byte, error) {
	if e.ManagementURL == "" {
		return nil, fmt.Errorf("no management API")
	}
	req, err := http.NewRequestWithContext(context.Background(), method, strings.TrimRight(e.ManagementURL, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	user, pass := "guest", "guest"
	if u, err := url.Parse(e.URL); err == nil && u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
	}
	req.SetBasicAuth(user, pass)
	req.Header.Set("X-Reason", "dlxbridge test")
	resp, err := mgmtClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != want {
		return nil, fmt.Errorf("%s %s: status %d: %s", method, path, resp.StatusCode, body)
	}
	return body, nil
}

// listPrefixed lists this test's queues and exchanges through the management
// API.
func (e *Env) listPrefixed() (queues, exchanges []string, err error) {
	for _, kind := range []string{"queues", "exchanges"} {
		body, err := e.mgmtGet("/api/" + kind + "?columns=name")
		if err != nil {
			return queues, exchanges, err
		}
		var items []struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(body, &items); err != nil {
			return queues, exchanges, err
		}
		for _, it := range items {
			if !strings.HasPrefix(it.Name, e.Prefix) {
				continue
			}
			if kind == "queues" {
				queues = append(queues, it.Name)
			} else {
				exchanges = append(exchanges, it.Name)
			}
		}
	}
	return queues, exchanges, nil
}

// CloseConnections force-closes, through the management API, every
// connection whose client-provided name is name, as a broker or network
// failure would. The management API lists a new connection only
// after its next stats emission (up to ~5s), so it polls until at least one
// matches or 20s pass. It returns how many it closed; the test fails without
// a management API.
func (e *Env) CloseConnections(name string) int {
	e.T.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		names := e.connectionsNamed(name)
		if len(names) > 0 || time.Now().After(deadline) {
			for _, n := range names {
				if _, err := e.mgmtDo(http.MethodDelete, "/api/connections/"+url.PathEscape(n), http.StatusNoContent); err != nil {
					e.T.Fatalf("close connection %s: %v", n, err)
				}
			}
			return len(names)
		}
		time.Sleep(250 * time.Millisecond) // polling the management API: it has no events
	}
}

func (e *Env) connectionsNamed(name string) []string {
	e.T.Helper()
	body := e.ManagementGet("/api/connections?columns=name,client_properties")
	var conns []struct {
		Name             string `json:"name"`
		ClientProperties struct {
			ConnectionName string `json:"connection_name"`
		} `json:"client_properties"`
	}
	if err := json.Unmarshal(body, &conns); err != nil {
		e.T.Fatalf("connections: %v", err)
	}
	var names []string
	for _, c := range conns {
		if c.ClientProperties.ConnectionName == name {
			names = append(names, c.Name)
		}
	}
	return names
}

// RequireManagement returns the management API URL, or skips the test
// (fails it under CI=true, where .ci/run enables the plugin) when none
// answers.
func (e *Env) RequireManagement() string {
	e.T.Helper()
	if e.ManagementURL == "" {
		if os.Getenv("CI") == "true" {
			e.T.Fatal("no management API under CI=true (enable rabbitmq_management or set RABBITMQ_MANAGEMENT_URL)")
		}
		e.T.Skip("no management API answers (set RABBITMQ_MANAGEMENT_URL to run this test)")
	}
	return e.ManagementURL
}

// mgmtClient keeps no idle connections, so no goroutine outlives a request
// (packages check for leaked goroutines with goleak).
var mgmtClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
