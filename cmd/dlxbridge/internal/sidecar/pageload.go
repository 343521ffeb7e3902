package sidecar

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlxbridge/dlxbridge/quarantine"
)

// What the page may cost. Reading needs no token, and any producer can grow
// the quarantine (a large invalid message makes a large record, kept for
// the retention), so the page's reads must not grow with the number of
// people, tabs or scripts looking at it:
//
//   - every listing (the overview, a group, a record's meta, a dry run's
//     selection) comes from one snapshot without payloads, shared by the
//     requests that want it at once and reused for a short while
//     (snapshotSource);
//   - a record page reads its one payload (quarantine.Inspector.ReadBody);
//   - at most pageInFlight requests are served at once; the others answer
//     503 with Retry-After, except that requests carrying the operator
//     token have pageOperatorInFlight more of their own, so that readers
//     who need no token cannot keep an operator from acting. Of those, at most pageBodyReads read a payload
//     at a time; the rest wait their turn (within bodyTimeout, else 503);
//   - the server's timeouts end slow or idle connections (newServer).
//
// This file is the seam between the page and the broker: handlers ask
// Page.shared, Page.sharedJobs and Page.body, and nothing else in the page
// reads.
const (
	// snapshotMaxAge is how long a snapshot is reused after its read
	// ended. A replay or purge from the page drops it at once.
	snapshotMaxAge = 3 * time.Second
	// snapshotTimeout bounds one shared read (it is no request's: one
	// client going away must not fail the others waiting for it).
	snapshotTimeout = 30 * time.Second
	// bodyTimeout bounds waiting for a payload read and doing it.
	bodyTimeout = 10 * time.Second
	// pageInFlight caps the page's requests served at once.
	pageInFlight = 16
	// pageOperatorInFlight is the extra room kept for requests that carry
	// the operator token once pageInFlight are being served.
	pageOperatorInFlight = 4
	// pageBodyReads caps the payload reads among them: each holds one
	// message, which can be as large as the broker's max message size.
	pageBodyReads = 4
	// busyRetryAfter is the Retry-After of a 503, in seconds.
	busyRetryAfter = 2
	// maxForm bounds a POSTed form (a thousand ticked ids fit well).
	maxForm = 4 << 20
)

// pageLimits are the page's read settings; a zero field is its default
// above. Tests shrink or stretch them.
type pageLimits struct {
	maxAge    time.Duration
	inFlight  int
	operator  int
	bodyReads int
	// joined, if set, is called when a request waits for a read another
	// request started; queued when one waits for a payload read (a
	// test's signals that the request has arrived).
	joined, queued func()
}

// pageLoad is the page's shared read and its caps, made on first use.
type pageLoad struct {
	snap     snapshotSource
	inFlight chan struct{}
	operator chan struct{}
	bodies   chan struct{}
}

func (p *Page) loads() *pageLoad {
	p.loadOnce.Do(func() {
		l := p.limits
		read := p.read
		if read == nil {
			read = p.readSnapshot
		}
		p.load = &pageLoad{
			snap:     snapshotSource{read: read, maxAge: orDefault(l.maxAge, snapshotMaxAge), now: time.Now, joined: l.joined},
			inFlight: make(chan struct{}, orDefault(l.inFlight, pageInFlight)),
			operator: make(chan struct{}, orDefault(l.operator, pageOperatorInFlight)),
			bodies:   make(chan struct{}, orDefault(l.bodyReads, pageBodyReads)),
		}
	})
	return p.load
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// readSnapshot is the one broker read behind every listing: all records'
// meta, no payloads, over a connection of its own.
func (p *Page) readSnapshot(ctx context.Context) (*quarantine.Snapshot, error) {
	conn, err := p.Dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return (&quarantine.Inspector{Conn: conn, Config: p.Config, OmitBodies: true, Verifier: p.Signer}).Snapshot(ctx)
}

// shared returns the page's current snapshot (see snapshotSource).
func (p *Page) shared(ctx context.Context) (*quarantine.Snapshot, error) {
	return p.loads().snap.get(ctx)
}

// sharedJobs are the replay jobs the shared snapshot's events tell of.
// Only when some job's events say it runs does it ask the broker whether
// its process still holds the replay lock (passive declares, on a
// connection of its own): no events stream is read per request.
func (p *Page) sharedJobs(ctx context.Context) ([]quarantine.Job, error) {
	snap, err := p.shared(ctx)
	if err != nil {
		return nil, err
	}
	jobs := snap.Jobs()
	if !slices.ContainsFunc(jobs, func(j quarantine.Job) bool { return j.State == quarantine.JobRunning }) {
		return jobs, nil
	}
	conn, err := p.Dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return jobs, (&quarantine.Inspector{Conn: conn, Config: p.Config}).CheckRunning(jobs)
}

// changed drops the shared snapshot: the page's own replay or purge
// shows at once.
func (p *Page) changed() { p.loads().snap.invalidate() }

// errBusy: no payload read became free within bodyTimeout.
var errBusy = errors.New("the quarantine page is busy")

// body reads rec's payload once one of the pageBodyReads is free.
func (p *Page) body(ctx context.Context, rec *quarantine.Record) ([]byte, error) {
	l := p.loads()
	ctx, cancel := context.WithTimeout(ctx, bodyTimeout)
	defer cancel()
	select {
	case l.bodies <- struct{}{}:
	default:
		if p.limits.queued != nil {
			p.limits.queued()
		}
		select {
		case l.bodies <- struct{}{}:
		case <-ctx.Done():
			return nil, errBusy
		}
	}
	defer func() { <-l.bodies }()
	conn, err := p.Dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return (&quarantine.Inspector{Conn: conn, Config: p.Config}).ReadBody(ctx, rec)
}

// limited serves h unless pageInFlight requests are being served already;
// then only a request with the operator token is served, in the room kept
// for those.
//
// A form is read whole first (at most maxForm bytes, within the server's
// read timeout): a client trickling its body must not hold a slot while it
// does.
func (p *Page) limited(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxForm)
			if err := r.ParseForm(); err != nil {
				http.Error(w, "the form could not be read: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		l := p.loads()
		select {
		case l.inFlight <- struct{}{}:
			defer func() { <-l.inFlight }()
		default:
			if p.Token == "" {
				busy(w)
				return
			}
			// The token decides whether this request is served: a wrong
			// one costs a try, as on an action, or being served would
			// tell a right guess from a wrong one past the limiter.
			// A dry run's confirmation stands for the token here as in
			// act: it is the confirm form's.
			err := p.checkToken(r)
			client, now := clientKey(r.RemoteAddr), p.clock()
			if c := r.PostFormValue("confirmation"); err == ErrNoToken && c != "" {
				err = ErrConfirmation
				if p.confirms.has(c, strings.TrimPrefix(r.URL.Path, "/quarantine/"), now) {
					err = nil
				}
			}
			if err == ErrNoToken {
				busy(w)
				return
			}
			if p.tooManyGuesses(w, client, now) {
				return
			}
			if err != nil {
				p.guessed(r, client, now, err)
				busy(w)
				return
			}
			select {
			case l.operator <- struct{}{}:
				defer func() { <-l.operator }()
			default:
				busy(w)
				return
			}
		}
		h(w, r)
	}
}

func busy(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(busyRetryAfter))
	http.Error(w, "the quarantine page is busy: try again in a few seconds", http.StatusServiceUnavailable)
}

// snapshotSource hands out one snapshot to every request that wants one
// while it is fresh (maxAge after its read ended), and otherwise lets one
// read run at a time: the requests that come meanwhile wait for it, each
// until its own context ends. A failed read is not kept; the next request
// tries again.
type snapshotSource struct {
	read   func(context.Context) (*quarantine.Snapshot, error)
	maxAge time.Duration
	now    func() time.Time
	joined func()

	mu     sync.Mutex
	last   *quarantine.Snapshot
	lastAt time.Time
	gen    uint64 // bumped by invalidate: a read begun before is not reused
	flight *snapshotFlight
}

type snapshotFlight struct {
	gen  uint64
	done chan struct{}
	snap *quarantine.Snapshot
	err  error
}

func (s *snapshotSource) get(ctx context.Context) (*quarantine.Snapshot, error) {
	s.mu.Lock()
	if s.last != nil && s.now().Sub(s.lastAt) < s.maxAge {
		snap := s.last
		s.mu.Unlock()
		return snap, nil
	}
	f, joined := s.flight, true
	if f == nil || f.gen != s.gen {
		f, joined = &snapshotFlight{gen: s.gen, done: make(chan struct{})}, false
		s.flight = f
		go s.run(f)
	}
	s.mu.Unlock()
	if joined && s.joined != nil {
		s.joined()
	}
	select {
	case <-f.done:
		return f.snap, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *snapshotSource) run(f *snapshotFlight) {
	ctx, cancel := context.WithTimeout(context.Background(), snapshotTimeout)
	defer cancel()
	f.snap, f.err = s.read(ctx)
	s.mu.Lock()
	if f.err == nil && f.gen == s.gen {
		s.last, s.lastAt = f.snap, s.now()
	}
	if s.flight == f {
		s.flight = nil
	}
	s.mu.Unlock()
	close(f.done)
}

func (s *snapshotSource) invalidate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	s.last = nil
}

// serverTimeouts bound each connection of the sidecar's server: headers,
// the whole request, the whole answer, and the wait for the next request.
type serverTimeouts struct {
	readHeader, read, write, idle time.Duration
}

// defaultTimeouts: write is above snapshotTimeout, so that a page request
// that waited for the shared read can still answer. A replay or purge that
// the operator token allows lifts its own write deadline (it runs at its
// rate, for as long as its records take).
var defaultTimeouts = serverTimeouts{readHeader: 10 * time.Second, read: 30 * time.Second, write: 60 * time.Second, idle: 120 * time.Second}

// newServer is the sidecar's HTTP server on h.
func newServer(h http.Handler, t serverTimeouts) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: t.readHeader, ReadTimeout: t.read, WriteTimeout: t.write, IdleTimeout: t.idle}
}
