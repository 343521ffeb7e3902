package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// The tests below run `dlxbridge run` as a real process, built once per
// test binary, against the broker and an httptest endpoint.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func binary(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("DLXBRIDGE_MEASURE_BINARY"); b != "" && os.Getenv("DLXBRIDGE_MEASURE_PAGE") != "" {
		return b // TestMeasurePageMemory measuring another build
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "dlxbridge-run-test")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "dlxbridge")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/dlxbridge/dlxbridge/cmd/dlxbridge").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

const jobSchema = `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
 "required": ["id"], "properties": {"id": {"type": "string", "minLength": 1}}, "additionalProperties": false}`

// sidecarProc is one running `dlxbridge run`.
type sidecarProc struct {
	t      *testing.T
	env    *brokertest.Env
	cmd    *exec.Cmd
	addr   string // of /metrics etc.
	queue  string
	quar   string
	stderr *syncBuffer
	exited chan struct{} // closed when the process has exited
	err    error         // its Wait error, once exited is closed
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startSidecar writes a one-queue config forwarding to endpoint and starts
// `dlxbridge run --apply` on it.
func startSidecar(t *testing.T, env *brokertest.Env, endpoint string, concurrency int) *sidecarProc {
	t.Helper()
	return startSidecarOn(t, env, writeSidecarConfig(t, env, endpoint, concurrency))
}

// writeSidecarConfig writes the test's config and returns its path.
func writeSidecarConfig(t *testing.T, env *brokertest.Env, endpoint string, concurrency int) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "schemas", "test.job"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "schemas", "test.job", "v1.json"), []byte(jobSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	mgmt := ""
	if env.ManagementURL != "" {
		mgmt = "  management_url: " + env.ManagementURL + "\n"
	}
	yaml := fmt.Sprintf(`broker:
%s  connection_name: %s
schemas:
  dir: %s
run:
  listen: 127.0.0.1:0
queues:
  - name: %s
    owner:
      team: team-test
    exchange: {name: %s, type: topic}
    bindings: ["job.#"]
    delivery_limit: 4
    consumer: {prefetch: 10, concurrency: %d, handler_timeout: 5s}
    retry: {tiers: [500ms, 2s, 4s], jitter: 0, max_attempts: 3, max_elapsed: 0s}
    quarantine: {queue: %s}
    accepts: [{type: test.job, versions: ["1"]}]
    forward: {url: "%s", timeout: 3s}
`, mgmt, env.Prefix, filepath.Join(dir, "schemas"), env.Name("work"), env.Name("ex"), concurrency, env.Name("work.quarantine"), endpoint)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfgPath
}

// startSidecarOn starts `dlxbridge run --apply` on the config at cfgPath;
// args are added last (a flag given again overrides the default).
func startSidecarOn(t *testing.T, env *brokertest.Env, cfgPath string, args ...string) *sidecarProc {
	t.Helper()
	return startSidecarAs(t, env, env.URL, cfgPath, args...)
}

// startSidecarURL is startSidecarOn with --url url.
func startSidecarURL(t *testing.T, env *brokertest.Env, cfgPath, url string) *sidecarProc {
	t.Helper()
	return startSidecarAs(t, env, url, cfgPath)
}

// startSidecarAs is startSidecarOn logged in with the AMQP URL url (one
// or a list of nodes).
func startSidecarAs(t *testing.T, env *brokertest.Env, url, cfgPath string, args ...string) *sidecarProc {
	t.Helper()
	return startSidecarWithin(t, env, url, cfgPath, 30*time.Second, args...)
}

// startSidecarWithin is startSidecarAs, waiting up to within for the
// process to serve and turn ready (an apply of many queues takes minutes).
func startSidecarWithin(t *testing.T, env *brokertest.Env, url, cfgPath string, within time.Duration, args ...string) *sidecarProc {
	t.Helper()
	p := &sidecarProc{t: t, env: env, queue: env.Name("work"), quar: env.Name("work.quarantine"),
		stderr: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(binary(t), append([]string{"run", "--config", cfgPath, "--url", url, "--apply", "--quarantine-refresh", "1s"}, args...)...)
	pr, pw := io.Pipe()
	p.cmd.Stderr = io.MultiWriter(p.stderr, pw)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited); pw.Close() }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(20 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.exited
			}
		}
		if t.Failed() {
			t.Logf("dlxbridge run's log:\n%s", p.stderr.String())
		}
	})
	addrRE := regexp.MustCompile(`msg=serving .*addr=(\S+)`)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		// A line longer than the scanner takes ends the loop: the pipe
		// must still be read, or the process blocks writing its log and
		// never exits (seen with 100 queues).
		_, _ = io.Copy(io.Discard, pr)
	}()
	select {
	case p.addr = <-found:
	case <-p.exited:
		t.Fatalf("dlxbridge run exited before serving: %v\n%s", p.err, p.stderr.String())
	case <-time.After(within):
		t.Fatalf("dlxbridge run did not serve within %s:\n%s", within, p.stderr.String())
	}
	p.waitReady(true, within)
	return p
}

func (p *sidecarProc) get(path string) (int, string) {
	resp, err := http.Get("http://" + p.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitReady polls /readyz (an HTTP endpoint has no events) until it
// answers ready (200) or not (503).
func (p *sidecarProc) waitReady(ready bool, within time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		code, _ := p.get("/readyz")
		if (code == 200) == ready && code != 0 {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("/readyz did not turn ready=%v within %s (last %d)\n%s", ready, within, code, p.stderr.String())
		}
		time.Sleep(5 * time.Millisecond) // the unready window lasts about the reconnect backoff (>= 50ms)
	}
}

// counter reads one sample of /metrics: name{labels} as written there.
func (p *sidecarProc) counter(series string) float64 {
	_, body := p.get("/metrics")
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, series+" ") {
			v, _ := strconv.ParseFloat(strings.TrimPrefix(line, series+" "), 64)
			return v
		}
	}
	return 0
}

// waitCounter polls /metrics until series reaches want.
func (p *sidecarProc) waitCounter(series string, want float64, within time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := p.counter(series)
		if got >= want {
			if got > want {
				p.t.Errorf("%s = %v, want %v", series, got, want)
			}
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s = %v after %s, want %v", series, got, within, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func publish(t *testing.T, env *brokertest.Env, exchange string, bodies map[string]string) {
	t.Helper()
	ch := env.Channel("publisher")
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(bodies)+1))
	for id, body := range bodies {
		err := ch.PublishWithContext(context.Background(), exchange, "job.x", true, false, amqp.Publishing{
			Type: "test.job", Headers: amqp.Table{"schema-version": "1"}, MessageId: id,
			ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for range bodies {
		if c := <-confirms; !c.Ack {
			t.Fatal("publish nacked")
		}
	}
}

func queueDepth(t *testing.T, env *brokertest.Env, name string) int {
	t.Helper()
	ch := env.Channel("inspect")
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		t.Fatalf("inspect %s: %v", name, err)
	}
	return q.Messages
}

// endpoint records each request by message id and answers by the id's
// prefix and attempt.
type endpoint struct {
	mu       sync.Mutex
	attempts map[string][]time.Time
	answer   func(id string, attempt int, w http.ResponseWriter)
}

func (e *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(HeaderMessageID)
	_, _ = io.Copy(io.Discard, r.Body)
	e.mu.Lock()
	e.attempts[id] = append(e.attempts[id], time.Now())
	n := len(e.attempts[id])
	e.mu.Unlock()
	e.answer(id, n, w)
}

func (e *endpoint) calls(id string) []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]time.Time(nil), e.attempts[id]...)
}

// Every class of answer leads to its outcome, with exact counts, and the
// counters on /metrics say the same.
func TestRunMapsEveryAnswerClass(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	ep := &endpoint{attempts: map[string][]time.Time{}, answer: func(id string, n int, w http.ResponseWriter) {
		kind, _, _ := strings.Cut(id, "-")
		switch {
		case kind == "ok":
			w.WriteHeader(200)
		case kind == "bad":
			http.Error(w, "customer is unknown", 422)
		case kind == "flaky" && n == 1:
			http.Error(w, "database restarting", 500)
		case kind == "down":
			http.Error(w, "database down", 502)
		case kind == "busy" && n == 1:
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(429)
		default:
			w.WriteHeader(204)
		}
	}}
	srv := httptest.NewServer(ep)
	defer srv.Close()
	// With the default breaker: a 429 opens it (a signal), and probes that
	// meet a "down" message (a plain 502, not a signal) are neutral, so the
	// queue is not held back by messages failing for reasons of their own.
	p := startSidecar(t, env, srv.URL+"/jobs", 4)

	const each = 3
	bodies := map[string]string{}
	for _, kind := range []string{"ok", "bad", "flaky", "down", "busy"} {
		for i := range each {
			id := fmt.Sprintf("%s-%d", kind, i)
			bodies[id] = fmt.Sprintf(`{"id":%q}`, id)
		}
	}
	bodies["invalid-0"] = `{"id": 7}` // schema failure: never forwarded
	publish(t, env, env.Name("ex"), bodies)

	q := p.queue
	p.waitCounter(fmt.Sprintf(`dlxbridge_deliveries_total{outcome="acked",queue=%q}`, q), 3*each, 60*time.Second)
	p.waitCounter(fmt.Sprintf(`dlxbridge_deliveries_total{outcome="quarantined",queue=%q}`, q), 2*each+1, 60*time.Second)
	// flaky: 1 retry each, down: 2 (then quarantined at attempt 3), busy: 1.
	if got := p.counter(fmt.Sprintf(`dlxbridge_deliveries_total{outcome="retried",queue=%q}`, q)); got != 4*each {
		t.Errorf("retried = %v, want %d", got, 4*each)
	}
	for class, want := range map[string]int{"permanent": each, "transient": each, "schema": 1} {
		if got := p.counter(fmt.Sprintf(`dlxbridge_quarantined_total{class=%q,queue=%q}`, class, q)); got != float64(want) {
			t.Errorf("quarantined %s = %v, want %d", class, got, want)
		}
	}
	for code, want := range map[string]int{"2xx": 3 * each, "4xx": 2 * each, "5xx": 4 * each} {
		if got := p.counter(fmt.Sprintf(`dlxbridge_forward_requests_total{code=%q,queue=%q}`, code, q)); got != float64(want) {
			t.Errorf("forward requests %s = %v, want %d", code, got, want)
		}
	}
	want := map[string]int{"ok": 1, "bad": 1, "flaky": 2, "down": 3, "busy": 2, "invalid": 0}
	for id := range bodies {
		kind, _, _ := strings.Cut(id, "-")
		calls := ep.calls(id)
		if len(calls) != want[kind] {
			t.Errorf("%s: endpoint called %d times, want %d", id, len(calls), want[kind])
		}
		if kind == "busy" && len(calls) == 2 {
			if d := calls[1].Sub(calls[0]); d < 2*time.Second {
				t.Errorf("%s: retried after %s despite Retry-After: 2", id, d)
			} else {
				t.Logf("%s: Retry-After 2 honoured: retried after %s", id, d.Round(time.Millisecond))
			}
		}
	}
	// The quarantine holds them: the runtime's keeper moves them from the
	// intake queue into the records stream, which the quarantine's metrics
	// read (every second here).
	for class, want := range map[string]int{"permanent": each, "transient": each, "schema": 1} {
		p.waitCounter(fmt.Sprintf(`dlxbridge_quarantine_records{class=%q,queue=%q,state="open"}`, class, q), float64(want), 30*time.Second)
	}
	p.oldestAgeGrows(q)
	if env.ManagementURL != "" {
		// Read from the management API, whose stats lag by a few seconds.
		p.waitCounter("dlxbridge_management_up", 1, 5*time.Second)
		p.waitCounter(fmt.Sprintf(`dlxbridge_work_queue_consumers{queue=%q}`, q), 1, 20*time.Second)
		if _, body := p.get("/metrics"); !strings.Contains(body, fmt.Sprintf(`dlxbridge_retry_lane_messages{lane="0",queue=%q,tier="1"}`, q)) {
			t.Errorf("/metrics lacks the retry lane depth of tier 1")
		}
	}
	if code, body := p.get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d %s", code, body)
	}
	if _, body := p.get("/metrics"); !strings.Contains(body, fmt.Sprintf(`dlxbridge_queue_info{owner="team-test",queue=%q} 1`, q)) {
		t.Errorf("/metrics lacks dlxbridge_queue_info for %s", q)
	}
}

// oldestAgeGrows scrapes /metrics until the oldest open quarantine record
// of queue has an age, then until a later scrape shows it older.
func (p *sidecarProc) oldestAgeGrows(queue string) {
	p.t.Helper()
	series := fmt.Sprintf(`dlxbridge_quarantine_oldest_open_age_seconds{queue=%q}`, queue)
	deadline := time.Now().Add(30 * time.Second)
	first := 0.0
	for {
		age := p.counter(series)
		switch {
		case first == 0 && age > 0:
			first = age
		case first > 0 && age > first:
			p.t.Logf("%s: %.3fs, then %.3fs", series, first, age)
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s did not grow within 30s (first %v, last %v)", series, first, age)
		}
		time.Sleep(100 * time.Millisecond) // /metrics has no events: a scrape loop
	}
}

// SIGTERM under load: the process stops consuming, finishes the requests in
// flight, exits 0, and every message is either handled or still queued.
func TestRunStopsOnSIGTERMWithoutLosingAnything(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	var mu sync.Mutex
	handled := map[string]int{}
	var cut int // requests whose client went away before the answer
	started := make(chan struct{}, 1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderMessageID)
		started <- struct{}{}
		select {
		case <-time.After(20 * time.Millisecond): // a slow endpoint
		case <-r.Context().Done():
			mu.Lock()
			cut++
			mu.Unlock()
			return
		}
		mu.Lock()
		handled[id]++
		mu.Unlock()
	}))
	defer srv.Close()
	p := startSidecar(t, env, srv.URL, 4)
	const n = 300
	bodies := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("m-%03d", i)
		bodies[id] = fmt.Sprintf(`{"id":%q}`, id)
	}
	publish(t, env, env.Name("ex"), bodies)
	for range 40 {
		<-started
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		if p.err != nil {
			t.Fatalf("dlxbridge run exited with %v after SIGTERM, want 0\n%s", p.err, p.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dlxbridge run did not exit within 30s of SIGTERM")
	}
	left := queueDepth(t, env, p.queue)
	mu.Lock()
	defer mu.Unlock()
	if cut != 0 {
		t.Errorf("%d requests in flight were cut by the stop", cut)
	}
	dups := 0
	for _, c := range handled {
		dups += c - 1
	}
	if len(handled)+left < n {
		t.Errorf("lost %d: %d handled + %d still queued, of %d", n-len(handled)-left, len(handled), left, n)
	}
	if q := queueDepth(t, env, p.quar); q != 0 {
		t.Errorf("%d quarantined, want 0", q)
	}
	t.Logf("SIGTERM after 40 requests: %d handled (%d duplicates), %d still queued, of %d", len(handled), dups, left, n)
}

// /readyz turns unready when the broker closes the connection and ready
// again after the runtime reconnects.
func TestRunReadinessFollowsTheConnection(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	env.RequireManagement()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	p := startSidecar(t, env, srv.URL, 1)
	if code, body := p.get("/readyz"); code != 200 {
		t.Fatalf("/readyz = %d %s", code, body)
	}
	if n := env.CloseConnections(env.Prefix + "/run"); n != 1 {
		t.Fatalf("closed %d connections named %s/run, want 1", n, env.Prefix)
	}
	p.waitReady(false, 10*time.Second)
	p.waitReady(true, 30*time.Second)
	if got := p.counter("dlxbridge_reconnects_total"); got < 1 {
		t.Errorf("dlxbridge_reconnects_total = %v after a reconnect", got)
	}
}

// While it drains after SIGTERM, /readyz says it is stopping (not that it
// lost its connection), and --apply said at start what it declared.
func TestRunSaysWhatItAppliedAndThatItIsStopping(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	inFlight, release := make(chan struct{}, 10), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	p := startSidecar(t, env, srv.URL, 1)
	if log := p.stderr.String(); !strings.Contains(log, "topology applied") || !strings.Contains(log, "queue '"+p.queue+"'") {
		t.Errorf("run --apply does not log what it declared:\n%s", log)
	}
	publish(t, env, env.Name("ex"), map[string]string{"m-1": `{"id":"m-1"}`})
	<-inFlight
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := p.get("/readyz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "stopping") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz while draining: %d %q, want 503 saying it is stopping", code, body)
		}
		time.Sleep(20 * time.Millisecond) // polling an HTTP endpoint: no event to wait on
	}
	close(release)
	select {
	case <-p.exited:
		if p.err != nil {
			t.Fatalf("exit %v after SIGTERM, want 0\n%s", p.err, p.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dlxbridge run did not exit within 30s of SIGTERM")
	}
}
