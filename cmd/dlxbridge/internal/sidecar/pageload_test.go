package sidecar

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/quarantine"
)

// Requests that want a snapshot while one is being read wait for that
// read; a fresh snapshot is reused; one the page changed is not; a failed
// read is not kept.
func TestSnapshotSourceSharesOneRead(t *testing.T) {
	t.Parallel()
	const n = 12
	var reads atomic.Int32
	release := make(chan struct{})
	var fail atomic.Bool
	joined := make(chan struct{}, n)
	s := &snapshotSource{maxAge: time.Minute, now: time.Now, joined: func() { joined <- struct{}{} },
		read: func(ctx context.Context) (*quarantine.Snapshot, error) {
			if reads.Add(1) == 1 {
				<-release
			}
			if fail.Load() {
				return nil, errors.New("broker down")
			}
			return &quarantine.Snapshot{At: time.Now()}, nil
		}}
	got := make(chan *quarantine.Snapshot, n)
	for range n {
		go func() {
			snap, err := s.get(context.Background())
			if err != nil {
				t.Error(err)
			}
			got <- snap
		}()
	}
	for range n - 1 {
		<-joined
	}
	close(release)
	first := <-got
	for range n - 1 {
		if snap := <-got; snap != first {
			t.Error("two concurrent requests got different snapshots")
		}
	}
	if r := reads.Load(); r != 1 {
		t.Fatalf("%d concurrent requests made %d reads, want 1", n, r)
	}
	if snap, _ := s.get(context.Background()); snap != first || reads.Load() != 1 {
		t.Errorf("a fresh snapshot was read again (%d reads)", reads.Load())
	}
	s.invalidate()
	fail.Store(true)
	if _, err := s.get(context.Background()); err == nil || reads.Load() != 2 {
		t.Errorf("after invalidate: %v, %d reads; want the failed second read", err, reads.Load())
	}
	fail.Store(false)
	if snap, err := s.get(context.Background()); err != nil || snap == first || reads.Load() != 3 {
		t.Errorf("after a failed read: %v, %d reads; want a third read", err, reads.Load())
	}
	// A waiting request leaves when its own context ends.
	reading, hold := make(chan struct{}), make(chan struct{})
	defer close(hold)
	w := &snapshotSource{maxAge: time.Minute, now: time.Now, joined: func() { joined <- struct{}{} },
		read: func(context.Context) (*quarantine.Snapshot, error) {
			close(reading)
			<-hold
			return nil, errors.New("never")
		}}
	go func() { _, _ = w.get(context.Background()) }() // the reader
	<-reading
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-joined; cancel() }()
	if _, err := w.get(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("a waiter whose context ended: %v", err)
	}
}

// Twelve concurrent GETs of the overview and a group make one broker read
// between them, and the snapshot they share holds no payload; a record
// page reads its one payload. (Before, each GET dialled and read every
// record with its payload.)
func TestPageConcurrentGETsShareOneBrokerRead(t *testing.T) {
	t.Parallel()
	b := setupPage(t)
	b.seedTwoGroups()
	const n = 12
	var dials atomic.Int32
	release := make(chan struct{})
	joined := make(chan struct{}, n)
	p := &Page{Config: b.cfg, Registry: b.reg, limits: pageLimits{maxAge: time.Minute, joined: func() { joined <- struct{}{} }},
		Dial: func() (*amqp.Connection, error) {
			if dials.Add(1) == 1 {
				<-release
			}
			return b.env.Dial("page"), nil
		}}
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	group := "/quarantine/group?" + url.Values{"queue": {b.q.Name}, "class": {"permanent"}, "fingerprint": {"fp-a"}}.Encode()
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range n {
		path := "/quarantine"
		if i%2 == 1 {
			path = group
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	for range n - 1 {
		<-joined
	}
	close(release)
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusOK {
			t.Errorf("GET %d: %d", i, c)
		}
	}
	if d := dials.Load(); d != 1 {
		t.Fatalf("%d concurrent GETs made %d broker reads, want 1", n, d)
	}
	snap, err := p.shared(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Records) != 5 {
		t.Fatalf("the shared snapshot holds %d records, want 5", len(snap.Records))
	}
	var id string
	for _, r := range snap.Records {
		if r.Body != nil {
			t.Errorf("record %s in the shared snapshot holds %d payload bytes", r.ID, len(r.Body))
		}
		if r.Envelope.Fingerprint == "fp-b" {
			id = r.ID
		}
	}
	code, body := get(t, srv.URL+"/quarantine/record/"+id)
	if code != http.StatusOK || !strings.Contains(body, "b-") || !strings.Contains(body, "&lt;script&gt;") {
		t.Errorf("record page: %d\n%s", code, body)
	}
	if d := dials.Load(); d != 2 {
		t.Errorf("the record page made %d reads, want 1 (its payload)", d-1)
	}
}

// An empty snapshot, for pages whose broker is never reached.
func emptySnapshot(context.Context) (*quarantine.Snapshot, error) {
	return &quarantine.Snapshot{At: time.Now(), Intake: map[string]int{}}, nil
}

// Past the cap of requests in flight, the page answers 503 with
// Retry-After and reads nothing; record pages past the cap of payload
// reads wait their turn.
func TestPageCapsRequestsInFlight(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()
	joined := make(chan struct{}, 4)
	var reads atomic.Int32
	p := unreachable("")
	p.limits = pageLimits{inFlight: 3, joined: func() { joined <- struct{}{} }}
	p.read = func(ctx context.Context) (*quarantine.Snapshot, error) {
		reads.Add(1)
		<-release
		return emptySnapshot(ctx)
	}
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	codes := make(chan int, 3)
	for range 3 {
		go func() {
			code, _ := get(t, srv.URL+"/quarantine")
			codes <- code
		}()
	}
	<-joined
	<-joined
	// Three are in flight (one reading, two waiting for it).
	for _, path := range []string{"/quarantine", "/quarantine/record/abcd", "/quarantine/group?queue=q"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != fmt.Sprint(busyRetryAfter) {
			t.Errorf("%s past the cap: %d, Retry-After %q; want 503, %d", path, resp.StatusCode, resp.Header.Get("Retry-After"), busyRetryAfter)
		}
	}
	if code, _ := post(t, srv.URL+"/quarantine/replay", url.Values{"queue": {"q"}}); code != http.StatusServiceUnavailable {
		t.Errorf("POST past the cap: %d, want 503", code)
	}
	unblock()
	for range 3 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a request within the cap: %d", code)
		}
	}
	if r := reads.Load(); r != 1 {
		t.Errorf("%d reads, want 1", r)
	}

	// Payload reads: one at a time here; a second record page waits for
	// the first's read to end.
	dialing := make(chan struct{}, 2)
	queued := make(chan struct{}, 1)
	hold := make(chan struct{})
	q := unreachable("")
	q.limits = pageLimits{bodyReads: 1, queued: func() { queued <- struct{}{} }}
	q.read = func(context.Context) (*quarantine.Snapshot, error) {
		return &quarantine.Snapshot{At: time.Now(), Records: []*quarantine.Record{{ID: "abcdef012345", State: quarantine.StateOpen}}}, nil
	}
	q.Dial = func() (*amqp.Connection, error) {
		dialing <- struct{}{}
		<-hold
		return nil, errors.New("no broker in this test")
	}
	srv2 := httptest.NewServer(q.Handler())
	defer srv2.Close()
	answers := make(chan int, 2)
	for range 2 {
		go func() {
			code, _ := get(t, srv2.URL+"/quarantine/record/abcdef012345")
			answers <- code
		}()
	}
	<-dialing
	<-queued
	if len(dialing) != 0 {
		t.Error("two payload reads at once, want one")
	}
	if code, _ := get(t, srv2.URL+"/quarantine"); code != http.StatusOK {
		t.Errorf("the overview while a payload is read: %d, want 200", code)
	}
	close(hold)
	<-dialing // the second, once the first is done
	for range 2 {
		if code := <-answers; code != http.StatusBadGateway {
			t.Errorf("a payload read without a broker: %d, want 502", code)
		}
	}
}

// Readers without a token cannot fill the page so that an operator cannot
// act: past the cap, a request with the right token has room of its own;
// one with a wrong token, or none, is busy.
func TestPageKeepsRoomForTheOperator(t *testing.T) {
	t.Parallel()
	const token = "operator-token-0123456789"
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()
	joined := make(chan struct{}, 4)
	p := unreachable(token)
	p.limits = pageLimits{inFlight: 1, operator: 1, joined: func() { joined <- struct{}{} }}
	reading := make(chan struct{}, 1)
	p.read = func(ctx context.Context) (*quarantine.Snapshot, error) {
		reading <- struct{}{}
		<-release
		return emptySnapshot(ctx)
	}
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	codes := make(chan int, 2)
	go func() { code, _ := get(t, srv.URL+"/quarantine"); codes <- code }() // reads, held
	withToken := func(tok string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/quarantine", nil)
		req.Header.Set(TokenHeader, tok)
		return http.DefaultClient.Do(req)
	}
	<-reading // the first holds the one slot: a second reader is busy
	if code, _ := get(t, srv.URL+"/quarantine"); code != http.StatusServiceUnavailable {
		t.Errorf("a reader past the cap: %d, want 503", code)
	}
	resp, err := withToken("wrong-token-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a wrong token past the cap: %d, want 503", resp.StatusCode)
	}
	go func() {
		resp, err := withToken(token)
		if err != nil {
			codes <- 0
			return
		}
		resp.Body.Close()
		codes <- resp.StatusCode
	}()
	<-joined // the operator's request is served: it waits for the same read
	unblock()
	for range 2 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a request within its room: %d, want 200", code)
		}
	}
}

// The sidecar's server bounds every connection: slow headers, a slow
// request, a slow answer and an idle keep-alive are cut. A replay or purge
// with the operator token lifts its own write deadline.
func TestServerTimeoutsEndSlowConnections(t *testing.T) {
	t.Parallel()
	d := defaultTimeouts
	if d.readHeader <= 0 || d.read < d.readHeader || d.write <= snapshotTimeout || d.idle <= 0 {
		t.Errorf("default timeouts %+v: want all set, read >= read header, write > the shared read's %s", d, snapshotTimeout)
	}
	const token = "0123456789abcdef-operator"
	p := unreachable(token)
	p.limits = pageLimits{maxAge: time.Nanosecond} // every request reads
	p.read = func(ctx context.Context) (*quarantine.Snapshot, error) {
		time.Sleep(400 * time.Millisecond) // longer than the write timeout below
		return emptySnapshot(ctx)
	}
	slow := http.NewServeMux()
	p.Mount(slow)
	srv := httptest.NewUnstartedServer(slow)
	short := serverTimeouts{readHeader: 100 * time.Millisecond, read: 200 * time.Millisecond, write: 150 * time.Millisecond, idle: 200 * time.Millisecond}
	srv.Config = newServer(slow, short)
	srv.Start()
	defer srv.Close()
	addr := srv.Listener.Addr().String()

	// send opens a connection to the page and writes raw on it.
	send := func(raw string) net.Conn {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_, _ = conn.Write([]byte(raw))
		return conn
	}
	// Headers that never end.
	if !closedWithin(send("GET /quarantine HTTP/1.1\r\nHost: "+addr+"\r\n"), 2*time.Second) {
		t.Error("a request whose headers never end was not cut")
	}
	// A body that never comes.
	if !closedWithin(send("POST /quarantine/replay HTTP/1.1\r\nHost: "+addr+"\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nqueue="), 2*time.Second) {
		t.Error("a request whose body never comes was not cut")
	}
	// A keep-alive connection left idle.
	conn3 := send("GET /healthz HTTP/1.1\r\nHost: " + addr + "\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(conn3), nil); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a first request on the idle connection: %v %v", resp, err)
	}
	if !closedWithin(conn3, 2*time.Second) {
		t.Error("an idle keep-alive connection was not closed")
	}
	// A GET that outlasts the write timeout gets no answer...
	if resp, err := http.Get(srv.URL + "/quarantine"); err == nil {
		resp.Body.Close()
		t.Errorf("a GET past the write timeout was answered: %d", resp.StatusCode)
	}
	// ...while the operator's dry run, as slow, is answered.
	code, body := post(t, srv.URL+"/quarantine/replay", url.Values{"queue": {"q"}, "class": {"c"}, "fingerprint": {"f"}, "token": {token}})
	if code != http.StatusOK || !strings.Contains(body, "0 open record(s) selected") {
		t.Errorf("the operator's slow dry run: %d\n%s", code, body)
	}
}

// closedWithin reports whether the server closes conn within d (reading
// whatever it sends first).
func closedWithin(conn net.Conn, d time.Duration) bool {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	return err == nil || !(errors.As(err, &ne) && ne.Timeout())
}

// Past the cap, a request's token decides whether it is served: a wrong
// one must cost a try as it does on an action, or a client that keeps the
// page busy (a few slow reads) could tell a right guess (served) from a
// wrong one (503) as fast as it can ask, without the limiter.
func TestTokenGuessesPastTheCapAreLimited(t *testing.T) {
	t.Parallel()
	const token = "operator-token-0123456789"
	release := make(chan struct{})
	p := unreachable(token)
	p.limits = pageLimits{inFlight: 1, operator: 1}
	reading := make(chan struct{}, 1)
	p.read = func(ctx context.Context) (*quarantine.Snapshot, error) {
		reading <- struct{}{}
		<-release
		return emptySnapshot(ctx)
	}
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	defer close(release)                                 // before the server closes: it waits for the held read
	go func() { _, _ = get(t, srv.URL+"/quarantine") }() // holds the one slot
	<-reading
	withToken := func(tok string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/quarantine", nil)
		req.Header.Set(TokenHeader, tok)
		// A request that is served waits for the held read: give up.
		resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var codes []int
	for i := range failBurst + 3 {
		codes = append(codes, withToken(fmt.Sprintf("wrong-token-%013d", i)))
	}
	for i, code := range codes {
		if want := http.StatusServiceUnavailable; i >= failBurst {
			want = http.StatusTooManyRequests
			if code != want {
				t.Errorf("guess %d past the cap: %d, want %d (the limiter)", i+1, code, want)
			}
		} else if code != want {
			t.Errorf("guess %d past the cap: %d, want %d", i+1, code, want)
		}
	}
	// Once limited, the right token is not told apart either.
	if code := withToken(token); code != http.StatusTooManyRequests {
		t.Errorf("the right token from a limited client past the cap: %d, want %d", code, http.StatusTooManyRequests)
	}
}

// A form sent slowly (a client trickling its POST body, up to the server's
// read timeout) does not hold one of the page's slots while it arrives:
// the cap counts requests being served, not bodies on their way.
func TestSlowFormsDoNotHoldTheCap(t *testing.T) {
	t.Parallel()
	p := unreachable("operator-token-0123456789")
	p.limits = pageLimits{inFlight: 1, operator: 1}
	p.read = emptySnapshot
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	body, trickle := io.Pipe()
	defer trickle.Close()
	sent := make(chan struct{})
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/quarantine/replay", body)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
		close(sent)
	}()
	if _, err := trickle.Write([]byte("queue=orders&")); err != nil { // the rest never comes
		t.Fatal(err)
	}
	// The server reads the first bytes, then waits for more.
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, _ := get(t, srv.URL+"/quarantine")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a reader while a form trickles in: %d, want 200", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-sent:
		t.Fatal("the trickling form was answered before its body ended")
	default:
	}
}

// The room kept for the operator takes the confirm of a dry run too: its
// form carries the dry run's confirmation, not the token, and with readers
// filling the cap the operator could dry-run but not confirm. A made-up
// confirmation there is a guess, as on the form itself.
func TestAConfirmationUsesTheOperatorsRoom(t *testing.T) {
	t.Parallel()
	const token = "operator-token-0123456789"
	release := make(chan struct{})
	p := unreachable(token)
	p.limits = pageLimits{inFlight: 1, operator: 1}
	reading := make(chan struct{}, 1)
	p.read = func(ctx context.Context) (*quarantine.Snapshot, error) {
		reading <- struct{}{}
		<-release
		return emptySnapshot(ctx)
	}
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	defer close(release)
	go func() { _, _ = get(t, srv.URL+"/quarantine") }() // holds the one slot
	<-reading
	id := p.confirms.issue("purge", selection{Queue: "orders", Reason: "bad data"}, []string{"r1"}, time.Now())
	code, body := post(t, srv.URL+"/quarantine/purge", url.Values{"confirmation": {id}})
	if code == http.StatusServiceUnavailable || code == http.StatusForbidden {
		t.Errorf("a confirm with the cap full: %d, want it served (this page has no broker: 502)\n%s", code, body)
	}
	for i := range failBurst + 1 {
		code, _ := post(t, srv.URL+"/quarantine/purge", url.Values{"confirmation": {fmt.Sprintf("%032x", i)}})
		if want := http.StatusServiceUnavailable; i == failBurst && code != http.StatusTooManyRequests || i < failBurst && code != want {
			t.Errorf("made-up confirmation %d with the cap full: %d", i+1, code)
		}
	}
}
