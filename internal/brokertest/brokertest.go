// Package brokertest gives every integration test a real RabbitMQ broker, a
// unique name prefix, named connections and cleanup of what it declared.
//
// The broker is found once per test binary:
//  1. RABBITMQ_URL, if set (RABBITMQ_MANAGEMENT_URL optionally names the
//     management API; otherwise http://<host>:15672 is probed);
//  2. otherwise amqp://guest:guest@127.0.0.1:5672/, the CLI's default, if a
//     broker answers there within a few seconds;
//  3. otherwise a testcontainers-go rabbitmq:4-management container, where a
//     Docker engine answers;
//  4. otherwise the test is skipped with the reason, except under CI=true,
//     where a missing broker fails the test: CI must never go green by
//     skipping.
//
// Before the first test, objects that earlier runs left behind are swept
// (see sweep.go). Each test's Env.URL leads through a recording relay, so
// every queue and exchange the test declares, by any path, is deleted over
// AMQP when the test ends, with or without the management plugin.
//
// It imports nothing of dlxbridge but internal/amqpx, so any package's
// tests can use it.
package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// dialTimeout bounds every connection the harness opens, TCP connect and
// AMQP handshake together: a wedged broker fails a test, it does not hang it.
const dialTimeout = 15 * time.Second

// Env is one test's slice of the broker.
type Env struct {
	T testing.TB
	// URL is the AMQP URL (with credentials) for everything the test runs.
	// For an Env from Require it leads through the harness's relay, which
	// passes every byte to the broker unchanged and notes each queue and
	// exchange declared, so that cleanup finds them.
	URL string
	// ManagementURL is the management API base URL, or "" if none answers.
	ManagementURL string
	// ServerVersion is the broker's version string, e.g. "3.10.8".
	ServerVersion string
	// Prefix is unique to this test; every name it declares should start
	// with it (use Name).
	Prefix string

	brokerURL string   // the broker itself, for cleanup
	journal   *journal // nil for a private node's Env

	mu      sync.Mutex
	objects []object // to delete, in the order first declared or tracked
	known   map[object]bool
	foreign []object // declared through the relay without Prefix
}

// object is a queue or an exchange, by name.
type object struct {
	kind kind
	name string
}

func (o object) String() string { return fmt.Sprintf("%s %q", o.kind, o.name) }

type broker struct {
	url, mgmt string
	skip      string
	err       error
	swept     string // what the sweep of earlier runs did, for the first test's log
}

var (
	once   sync.Once
	shared broker
	// unanswered is set when the broker did not answer a dial in time;
	// every later test of this binary fails at once instead of waiting
	// out the same timeout.
	unanswered atomic.Pointer[error]
	sweptOnce  sync.Once
)

func find() broker {
	once.Do(func() {
		shared = locate()
		if shared.url != "" {
			shared.swept = sweepEarlierRuns(journalRoot(), shared.url, shared.mgmt)
		}
	})
	return shared
}

// defaultProbeTimeout bounds the look for a broker at amqpx.DefaultURL.
const defaultProbeTimeout = 3 * time.Second

func locate() broker {
	if u := os.Getenv("RABBITMQ_URL"); u != "" {
		return withManagement(u)
	}
	if conn, err := dialWithin(amqpx.DefaultURL, "dlxbridge-test/locate", defaultProbeTimeout); err == nil {
		_ = conn.Close()
		return withManagement(amqpx.DefaultURL)
	}
	return startContainer()
}

func withManagement(u string) broker {
	b := broker{url: u, mgmt: bareManagementURLs(os.Getenv("RABBITMQ_MANAGEMENT_URL"))}
	if b.mgmt == "" {
		b.mgmt = probeManagement(u)
	}
	return b
}

// bareManagementURLs drops any user and password, and a trailing slash, from
// each URL of a comma separated management URL list. The harness logs in to
// the management API with the AMQP URL's credentials, and so do the
// commands when a management URL carries none; tests that log in as a user
// of their own, or pair the API with a node that is down, need exactly
// that. Left in, "http://guest:guest@host:15672/" (a common way to write
// it) would override their user, make the list's credentials differ, and
// turn base+"/api/..." into a path the API does not know.
func bareManagementURLs(list string) string {
	if list == "" {
		return ""
	}
	parts := strings.Split(list, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil {
			u.User = nil
			u.Path = strings.TrimRight(u.Path, "/")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}

// probeManagement guesses http://<amqp host>:15672 and keeps it if it
// answers for the same broker: one of the AMQP listeners it reports has the
// URL's port (a second node on the same host has its own API, or none).
func probeManagement(amqpURL string) string {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return ""
	}
	port := u.Port()
	if port == "" {
		port = "5672"
	}
	m := "http://" + u.Hostname() + ":15672"
	body, err := managementDo(m, amqpURL, http.MethodGet, "/api/overview?columns=listeners", http.StatusOK)
	if err != nil {
		return ""
	}
	var overview struct {
		Listeners []struct {
			Protocol string `json:"protocol"`
			Port     int    `json:"port"`
		} `json:"listeners"`
	}
	if json.Unmarshal(body, &overview) != nil {
		return ""
	}
	for _, l := range overview.Listeners {
		if l.Protocol == "amqp" && strconv.Itoa(l.Port) == port {
			return m
		}
	}
	return ""
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
	if err := unanswered.Load(); err != nil {
		t.Fatalf("the broker did not answer earlier in this test binary, so this test does not wait for it: %v", *err)
	}
	sweptOnce.Do(func() {
		if b.swept != "" {
			t.Logf("brokertest: %s", b.swept)
		}
	})
	return newEnv(t, b.url, b.mgmt, processJournal(b.url))
}

// newEnv makes an Env on the broker at brokerURL whose URL leads through a
// recording relay, and deletes what the test declared when it ends. j (may
// be nil) remembers the declared names until they are deleted, for the
// sweep of a later run should this process die first.
func newEnv(t testing.TB, brokerURL, mgmt string, j *journal) *Env {
	t.Helper()
	e := &Env{T: t, URL: brokerURL, ManagementURL: mgmt, Prefix: prefixFor(t.Name()), brokerURL: brokerURL, journal: j}
	if relayed, err := e.startRecorder(); err != nil {
		t.Fatalf("start the recording relay: %v", err)
	} else if relayed == "" {
		ep, _ := amqpx.ParseAMQPURL(brokerURL)
		t.Logf("brokertest: %s is not plain AMQP: declarations are not recorded, cleanup relies on Track* and the management API", ep)
	} else {
		e.URL = relayed
	}
	// Opened before anything is declared and closed after cleanup: while
	// it is open, the sweep of another run leaves this test's objects alone.
	// It goes to the broker directly, so that its error is the broker's.
	conn, err := dialWithin(brokerURL, e.Prefix+"/probe", dialTimeout)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			unanswered.CompareAndSwap(nil, &err)
		}
		t.Fatalf("dial broker: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if v, ok := conn.Properties["version"].(string); ok {
		e.ServerVersion = v
	}
	t.Cleanup(e.cleanup)
	return e
}

// startRecorder starts the relay and returns the URL that leads through it,
// or "" when the broker URL is not plain amqp:// (a TLS stream cannot be
// read). The relay stops after every other cleanup of the test.
func (e *Env) startRecorder() (string, error) {
	u, err := amqpx.ParseURL("AMQP URL", e.brokerURL)
	if err != nil {
		return "", err
	}
	if u.Scheme != "amqp" {
		return "", nil
	}
	port := u.Port()
	if port == "" {
		port = "5672"
	}
	r, err := startRecorder(net.JoinHostPort(u.Hostname(), port), e.record)
	if err != nil {
		return "", err
	}
	e.T.Cleanup(r.close)
	u.Host = r.addr()
	return u.String(), nil
}

var unsafe = regexp.MustCompile(`[^A-Za-z0-9]+`)

// prefixFor makes "t-[<run>-]<test name>-<unix time base 36><6 hex>". The
// time lets a sweep tell an old object from one a running test just made;
// <run> is DLXBRIDGE_TEST_RUN, by which .ci/run finds what its own run left.
func prefixFor(name string) string {
	s := strings.Trim(unsafe.ReplaceAllString(strings.ToLower(name), "-"), "-")
	if len(s) > 40 {
		s = s[:40]
	}
	var r [3]byte
	_, _ = rand.Read(r[:])
	p := "t-"
	if run := runTag(); run != "" {
		p += run + "-"
	}
	return p + s + "-" + strconv.FormatInt(time.Now().Unix(), 36) + hex.EncodeToString(r[:])
}

// runTag is DLXBRIDGE_TEST_RUN, if it is a short lowercase word.
func runTag() string {
	run := os.Getenv("DLXBRIDGE_TEST_RUN")
	if len(run) > 12 || unsafe.MatchString(run) || strings.ToLower(run) != run {
		return ""
	}
	return run
}

// prefixTime reads the time out of a name made with prefixFor; false for
// any other name.
func prefixTime(name string) (prefix string, made time.Time, ok bool) {
	prefix, _, _ = strings.Cut(name, ".")
	if !strings.HasPrefix(prefix, "t-") {
		return "", time.Time{}, false
	}
	stamp := prefix[strings.LastIndexByte(prefix, '-')+1:]
	if len(stamp) <= 6 {
		return "", time.Time{}, false
	}
	if _, err := hex.DecodeString(stamp[len(stamp)-6:]); err != nil {
		return "", time.Time{}, false
	}
	secs, err := strconv.ParseInt(stamp[:len(stamp)-6], 36, 64)
	if err != nil {
		return "", time.Time{}, false
	}
	return prefix, time.Unix(secs, 0), true
}

// Name returns Prefix + "." + s.
func (e *Env) Name(s string) string { return e.Prefix + "." + s }

// Dial opens a connection named "<prefix>/<purpose>" that is closed at the
// end of the test.
func (e *Env) Dial(purpose string) *amqp.Connection {
	e.T.Helper()
	conn, err := dialWithin(e.URL, e.Prefix+"/"+purpose, dialTimeout)
	if err != nil {
		e.T.Fatalf("dial broker: %v", err)
	}
	e.T.Cleanup(func() { _ = conn.Close() })
	return conn
}

// dialWithin opens a named connection; connect and handshake together take
// at most timeout. Errors never contain the password.
func dialWithin(u, name string, timeout time.Duration) (*amqp.Connection, error) {
	ep, err := amqpx.ParseAMQPURL(u)
	if err != nil {
		return nil, err
	}
	cfg := amqp.Config{
		Properties: amqp.NewConnectionProperties(),
		Heartbeat:  10 * time.Second,
		Dial:       amqp.DefaultDial(timeout),
	}
	cfg.Properties.SetClientConnectionName(name)
	conn, err := amqp.DialConfig(u, cfg)
	if err != nil {
		return nil, &amqpx.DialError{Endpoint: ep, Err: err}
	}
	return conn, nil
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

// TrackQueue and TrackExchange register names to delete at cleanup. Only
// needed for a name that does not start with Prefix, or one declared on a
// connection that does not go through Env.URL.
func (e *Env) TrackQueue(name string) { e.track(object{queue, name}) }

// TrackExchange registers an exchange to delete at cleanup.
func (e *Env) TrackExchange(name string) { e.track(object{exchange, name}) }

func (e *Env) track(o object) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.remember(o)
}

// record is called by the relay for every queue or exchange declared
// through Env.URL. A name without Prefix is not deleted (it may belong to
// someone else) unless tracked: cleanup reports it instead.
func (e *Env) record(k kind, name string) {
	o := object{k, name}
	e.mu.Lock()
	defer e.mu.Unlock()
	if strings.HasPrefix(name, e.Prefix) {
		e.remember(o)
	} else if !slices.Contains(e.foreign, o) {
		e.foreign = append(e.foreign, o)
	}
}

// remember adds o to the objects to delete; e.mu is held.
func (e *Env) remember(o object) {
	if e.known[o] {
		return
	}
	if e.known == nil {
		e.known = map[object]bool{}
	}
	e.known[o] = true
	e.objects = append(e.objects, o)
	if e.journal != nil {
		e.journal.add(o)
	}
}

// cleanup deletes, over AMQP, every queue and exchange the test declared
// or tracked, and, where the management API answers, every one whose name
// starts with Prefix.
func (e *Env) cleanup() {
	var listed []object
	if e.ManagementURL != "" {
		var err error
		listed, err = listObjects(e.ManagementURL, e.brokerURL, func(name string) bool { return strings.HasPrefix(name, e.Prefix) })
		if err != nil {
			e.T.Logf("cleanup: management listing: %v", err)
		}
	}
	e.mu.Lock()
	for _, f := range e.foreign {
		if !e.known[f] {
			e.T.Errorf("brokertest: the test declared %s, whose name lacks the test's prefix %q, so it is left on the broker: use Env.Name, or TrackQueue/TrackExchange to have it deleted", f, e.Prefix)
		}
	}
	objects := append([]object(nil), e.objects...)
	for _, o := range listed {
		if !e.known[o] {
			objects = append(objects, o)
		}
	}
	e.mu.Unlock()
	if len(objects) == 0 {
		return
	}
	conn, err := dialWithin(e.brokerURL, e.Prefix+"/cleanup", dialTimeout)
	if err != nil {
		e.T.Errorf("cleanup: %v; left on the broker: %v", err, objects)
		return
	}
	defer conn.Close()
	deleted, err := deleteObjects(conn, objects)
	if e.journal != nil {
		e.journal.done(deleted)
	}
	if err != nil {
		e.T.Errorf("cleanup: %v", err)
	}
}

// deleteObjects deletes queues first (which removes their bindings), then
// exchanges. A failed delete closes its channel, so the next one gets a
// fresh channel. A missing object counts as deleted. It returns what is
// gone and an error naming what is not.
func deleteObjects(conn *amqp.Connection, objects []object) (gone []object, err error) {
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	var failed []string
	for _, k := range []kind{queue, exchange} {
		for _, o := range objects {
			if o.kind != k {
				continue
			}
			if ch == nil {
				if ch, err = conn.Channel(); err != nil {
					return gone, fmt.Errorf("open a channel to delete %s: %w", o, err)
				}
			}
			if k == queue {
				_, err = ch.QueueDelete(o.name, false, false, false)
			} else {
				err = ch.ExchangeDelete(o.name, false, false)
			}
			var ae *amqp.Error
			if err != nil {
				ch = nil // the broker closed it
			}
			if err == nil || errors.As(err, &ae) && ae.Code == amqp.NotFound {
				gone = append(gone, o)
				continue
			}
			failed = append(failed, fmt.Sprintf("%s: %v", o, err))
		}
	}
	if len(failed) > 0 {
		return gone, fmt.Errorf("could not delete %s", strings.Join(failed, "; "))
	}
	return gone, nil
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

// ManagementVhost is the test's virtual host escaped for a management API
// path, e.g. "/api/queues/"+e.ManagementVhost()+"/"+url.PathEscape(name).
func (e *Env) ManagementVhost() string { return vhostPath(e.brokerURL) }

func (e *Env) mgmtGet(path string) ([]byte, error) {
	return e.mgmtDo(http.MethodGet, path, http.StatusOK)
}

// mgmtDo sends an authenticated request (credentials from the AMQP URL) and
// returns the body; a status other than want is an error.
func (e *Env) mgmtDo(method, path string, want int) ([]byte, error) {
	return managementDo(e.ManagementURL, e.brokerURL, method, path, want)
}

// managementDo calls the management API; a GET that gets a 5xx is tried
// again, twice (the 3.10.8 API answers 500 now and then while queues are
// being declared and deleted around it).
func managementDo(base, amqpURL, method, path string, want int) ([]byte, error) {
	body, status, err := managementOnce(base, amqpURL, method, path, want)
	for try := 1; try < 3 && err != nil && method == http.MethodGet && status >= 500; try++ {
		time.Sleep(200 * time.Millisecond) // no event says the API is healthy again
		body, status, err = managementOnce(base, amqpURL, method, path, want)
	}
	return body, err
}

func managementOnce(base, amqpURL, method, path string, want int) ([]byte, int, error) {
	if base == "" {
		return nil, 0, fmt.Errorf("no management API")
	}
	req, err := http.NewRequestWithContext(context.Background(), method, strings.TrimRight(base, "/")+path, nil)
	if err != nil {
		return nil, 0, err
	}
	user, pass := credentials(amqpURL)
	req.SetBasicAuth(user, pass)
	req.Header.Set("X-Reason", "dlxbridge test")
	resp, err := mgmtClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, resp.StatusCode, err
	}
	if resp.StatusCode != want {
		return nil, resp.StatusCode, fmt.Errorf("%s %s: status %d: %s", method, path, resp.StatusCode, body)
	}
	return body, resp.StatusCode, nil
}

// credentials are the AMQP URL's user and password (guest by default).
func credentials(amqpURL string) (user, pass string) {
	user, pass = "guest", "guest"
	if u, err := url.Parse(amqpURL); err == nil && u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
	}
	return user, pass
}

// vhostPath is the AMQP URL's virtual host, escaped for a management API
// path ("/" unless the URL names another).
func vhostPath(amqpURL string) string {
	vhost := "/"
	if u, err := url.Parse(amqpURL); err == nil && len(u.Path) > 1 {
		vhost = u.Path[1:]
	}
	return url.PathEscape(vhost)
}

// listObjects lists, through the management API, the queues and exchanges
// of the AMQP URL's virtual host whose names keep accepts.
func listObjects(base, amqpURL string, keep func(name string) bool) ([]object, error) {
	var objects []object
	for _, k := range []kind{queue, exchange} {
		body, err := managementDo(base, amqpURL, http.MethodGet, "/api/"+k.String()+"s/"+vhostPath(amqpURL)+"?columns=name", http.StatusOK)
		if err != nil {
			return objects, err
		}
		var items []struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(body, &items); err != nil {
			return objects, err
		}
		for _, it := range items {
			if keep(it.Name) {
				objects = append(objects, object{k, it.Name})
			}
		}
	}
	return objects, nil
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
	conns, err := listConnections(e.ManagementURL, e.brokerURL)
	if err != nil {
		e.T.Fatalf("connections: %v", err)
	}
	var names []string
	for _, c := range conns {
		if c.ClientName == name {
			names = append(names, c.Name)
		}
	}
	return names
}

// brokerConn is a connection as the management API lists it: the broker's
// name for it and the name the client gave it.
type brokerConn struct{ Name, ClientName string }

func listConnections(base, amqpURL string) ([]brokerConn, error) {
	body, err := managementDo(base, amqpURL, http.MethodGet, "/api/connections?columns=name,client_properties", http.StatusOK)
	if err != nil {
		return nil, err
	}
	var items []struct {
		Name             string `json:"name"`
		ClientProperties struct {
			ConnectionName string `json:"connection_name"`
		} `json:"client_properties"`
	}
	if err := json.Unmarshal(body, &items); err != nil {
		return nil, err
	}
	conns := make([]brokerConn, len(items))
	for i, it := range items {
		conns[i] = brokerConn{it.Name, it.ClientProperties.ConnectionName}
	}
	return conns, nil
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
