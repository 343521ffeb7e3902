package sidecar

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/quarantine"
)

// pageReplayWait is how long a replay confirmed on the page is waited for
// before the answer says it runs on in the background.
const pageReplayWait = 3 * time.Second

// replayDetached runs a confirmed replay on a connection of its own,
// detached from the request: closing the browser's page, or the request
// timing out, does not stop it (its job can be followed and cancelled on
// /quarantine/jobs; Close stops it). It waits up to pageReplayWait: a replay done by then
// is answered in full, else with its plan and running true.
func (p *Page) replayDetached(lockWait time.Duration, by string, opts quarantine.ReplayOptions) (*quarantine.ReplayResult, bool, error) {
	ctx, ok := p.background()
	if !ok {
		return nil, false, errShutdown
	}
	conn, err := p.Dial()
	if err != nil {
		p.bg.runs.Done()
		return nil, false, err
	}
	p.bg.track(conn, true)
	rp := &quarantine.Replayer{Conn: conn, Config: p.Config, Registry: p.Registry, By: by, LockWait: lockWait, Signer: p.Signer}
	started := make(chan *quarantine.ReplayResult, 1)
	opts.Started = func(r *quarantine.ReplayResult) {
		// A copy of what no longer changes: the goroutine goes on
		// appending to r.Sent.
		started <- &quarantine.ReplayResult{Run: r.Run, Selected: r.Selected, Plan: r.Plan, Sent: []string{},
			Invalid: r.Invalid, OverBudget: r.OverBudget}
	}
	var res *quarantine.ReplayResult
	var rerr error
	done := make(chan struct{})
	go func() {
		defer p.bg.runs.Done()
		defer close(done)
		defer p.bg.track(conn, false)
		defer conn.Close()
		defer p.changed()
		res, rerr = rp.Replay(ctx, opts)
		if res != nil {
			p.log().Info("quarantine page: replay ended", "by", by, "run", res.Run, "selected", res.Selected,
				"sent", len(res.Sent), "stopped", res.Stopped, "stop", res.Stop, "error", rerr)
		}
	}()
	select {
	case <-done:
		return res, false, rerr
	case plan := <-started:
		// Its job shows on the jobs page at once, not after the shared
		// snapshot's age.
		p.changed()
		select {
		case <-done:
			return res, false, rerr
		case <-time.After(pageReplayWait):
			return plan, true, nil
		}
	}
}

// pageBackground is what Close needs of the replays running in the
// background.
type pageBackground struct {
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelCauseFunc
	closed bool
	runs   sync.WaitGroup
	conns  map[*amqp.Connection]bool
}

func (b *pageBackground) track(conn *amqp.Connection, running bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conns == nil {
		b.conns = map[*amqp.Connection]bool{}
	}
	if running {
		b.conns[conn] = true
	} else {
		delete(b.conns, conn)
	}
}

// pageCloseWait is how long Close waits for the background replays to
// stop by themselves: the message in flight and two events, a moment
// unless the broker stopped answering (a resource alarm blocks the
// connection; no confirm comes before it clears).
const pageCloseWait = 10 * time.Second

// jobsView is the replay jobs, newest first, or one job.
type jobsView struct {
	Jobs []quarantine.Job
	Job  *quarantine.Job
	// Running: some job runs (the page then reloads itself).
	Running bool
}

// jobs serves /quarantine/jobs (every replay job: state, counts,
// progress) and /quarantine/jobs?id=ID (one job and each message's
// outcome), from the shared snapshot's events (Page.sharedJobs).
func (p *Page) jobs(w http.ResponseWriter, r *http.Request) {
	jobs, err := p.sharedJobs(r.Context())
	if err != nil {
		p.fail(w, http.StatusBadGateway, err)
		return
	}
	jv := &jobsView{}
	if id := r.URL.Query().Get("id"); id != "" {
		j, err := quarantine.FindJob(jobs, id)
		if err != nil {
			p.fail(w, http.StatusNotFound, err)
			return
		}
		jv.Job, jv.Running = j, j.State == quarantine.JobRunning
	} else {
		const shown = 100
		jv.Jobs = jobs[:min(len(jobs), shown)]
		for _, j := range jv.Jobs {
			jv.Running = jv.Running || j.State == quarantine.JobRunning
		}
	}
	v := &view{Title: "Replay jobs", Actions: p.Token != "", Jobs: jv}
	if jv.Running {
		v.Refresh = 5
	}
	p.render(w, http.StatusOK, v)
}

// cancelJob serves POST /quarantine/jobs/cancel: with the operator token,
// it asks the running job "id" to stop after the message in flight.
func (p *Page) cancelJob(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm) // read by limited, when mounted
	client, now := clientKey(r.RemoteAddr), p.clock()
	if p.Token != "" && p.tooManyGuesses(w, client, now) {
		return
	}
	if err := p.checkToken(r); err != nil {
		p.guessed(r, client, now, err)
		p.fail(w, http.StatusForbidden, err)
		return
	}
	id := strings.TrimSpace(r.PostFormValue("id"))
	conn, err := p.Dial()
	if err != nil {
		p.fail(w, http.StatusBadGateway, err)
		return
	}
	defer conn.Close()
	rp := &quarantine.Replayer{Conn: conn, Config: p.Config, By: "web", Signer: p.Signer}
	j, err := rp.CancelJob(r.Context(), id, "cancelled on the quarantine page")
	switch {
	case errors.Is(err, quarantine.ErrNoJob):
		p.fail(w, http.StatusNotFound, err)
		return
	case err != nil:
		p.fail(w, http.StatusConflict, err)
		return
	}
	p.log().Info("quarantine page: asked a replay job to stop", "job", j.ID, "remote", r.RemoteAddr)
	http.Redirect(w, r, "/quarantine/jobs?id="+j.ID, http.StatusSeeOther)
}

// errShutdown ends the background replays when the page closes.
var errShutdown = errors.New("the runtime is shutting down")

// background is the context a replay confirmed on the page runs under
// (ok false once Close has begun), counted so that Close can wait for it.
func (p *Page) background() (ctx context.Context, ok bool) {
	p.bg.mu.Lock()
	defer p.bg.mu.Unlock()
	if p.bg.closed {
		return nil, false
	}
	if p.bg.ctx == nil {
		p.bg.ctx, p.bg.cancel = context.WithCancelCause(context.Background())
	}
	p.bg.runs.Add(1)
	return p.bg.ctx, true
}

// Close stops the replays running in the background after the message
// each has in flight, and waits until each has marked what it sent and
// written its end (at most pageCloseWait, then it closes their
// connections); a replay confirmed after it is refused. The runtime
// calls it when it shuts down: a replay the process exited under would
// leave a message it sent unmarked (sent again by the next replay) and
// its job without an end.
func (p *Page) Close() {
	p.bg.mu.Lock()
	p.bg.closed = true
	if p.bg.cancel != nil {
		p.bg.cancel(errShutdown)
	}
	p.bg.mu.Unlock()
	done := make(chan struct{})
	go func() { p.bg.runs.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(pageCloseWait):
	}
	// Past the wait, each replay's connection is closed under it: what it
	// sent and did not mark is sent again by the next replay (a duplicate,
	// never a loss), and its job reads stopped once its lock is gone.
	p.bg.mu.Lock()
	for conn := range p.bg.conns {
		_ = amqpx.CloseConnection(conn, 0)
	}
	p.bg.mu.Unlock()
	<-done
}
