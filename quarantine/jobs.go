package quarantine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// A replay is a job: its run id, the events it writes (claimed,
// replay-started, replayed, replay-finished or replay-refused), the
// cancel-requested events written for it, and the replay-outcome events
// the runtime writes as it settles the messages it sent. Everything a job
// is lives in the events streams, so any reader sees it, whichever process
// ran it.

// Job states.
const (
	JobRunning   = "running"
	JobDone      = "done"
	JobCancelled = "cancelled"
	JobStopped   = "stopped"
)

// What became of a message a job sent.
const (
	// JobHandled: its handler succeeded after the replay.
	JobHandled = "handled"
	// JobQuarantinedAgain: it failed again and is back in a quarantine.
	JobQuarantinedAgain = "quarantined-again"
	// JobPending: sent, and no outcome recorded yet (its handler has not
	// run, it waits in a retry lane, or the runtime that settled it had no
	// key to record it with).
	JobPending = "pending"
)

// Job is one replay as its events tell it.
type Job struct {
	ID     string `json:"id"`
	By     string `json:"by"`
	Reason string `json:"reason,omitempty"`
	Filter string `json:"filter,omitempty"`
	// Quarantines are the intakes whose events streams hold its events.
	Quarantines []string  `json:"quarantines"`
	Started     time.Time `json:"started"`
	Finished    time.Time `json:"finished,omitzero"`
	State       string    `json:"state"`
	// Stop says why it stopped or was cancelled.
	Stop string `json:"stop,omitempty"`
	// Selected records matched its selection; ToSend were to be sent;
	// Sent were published (Confirmed of them confirmed and marked
	// replayed); Refused were not sent (schema, redrive budget, no
	// payload).
	Selected  int `json:"selected"`
	ToSend    int `json:"to_send"`
	Sent      int `json:"sent"`
	Confirmed int `json:"confirmed"`
	Refused   int `json:"refused"`
	// Handled, QuarantinedAgain and Pending count Messages by outcome.
	Handled          int `json:"handled"`
	QuarantinedAgain int `json:"quarantined_again"`
	Pending          int `json:"pending"`
	// Windows are the first outages an automatic redrive covered (at most
	// ten: its events name no more).
	Windows []OutageWindow `json:"windows,omitempty"`
	// Messages are the records it sent, in order, with their outcomes.
	Messages []JobMessage `json:"messages"`
	// Unverified: some event of the job counted without a valid
	// signature (read without the key, or written before signing began).
	Unverified bool `json:"unverified,omitempty"`
	// cancelAsked: a cancel-requested event names it.
	cancelAsked bool
}

// JobMessage is one record a job sent, and what became of it.
type JobMessage struct {
	ID      string    `json:"id"`
	ToQueue string    `json:"to_queue"`
	Outcome string    `json:"outcome"`
	At      time.Time `json:"at,omitzero"`
}

// jobsOf builds the jobs the events tell of (every quarantine's, merged in
// time order; ignored events count for nothing), newest first. A job
// without a finishing event is running, as far as the events say (see
// Inspector.Jobs, which asks the broker whether its lock is still held).
// An outcome recorded twice for a message keeps the later one. It is pure.
func jobsOf(events []Event) []Job {
	byRun := map[string]*Job{}
	var order []string
	msgs := map[string]map[string]int{} // run -> record -> index in Messages
	get := func(e *Event) *Job {
		j, ok := byRun[e.Run]
		if !ok {
			j = &Job{ID: e.Run, State: JobRunning, Messages: []JobMessage{}}
			byRun[e.Run] = j
			order = append(order, e.Run)
			msgs[e.Run] = map[string]int{}
		}
		return j
	}
	isReplay := map[string]bool{}
	for i := range events {
		e := &events[i]
		if e.Ignored || e.Run == "" {
			continue
		}
		switch e.Kind {
		case EventReplayStarted, EventReplayFinished, EventReplayRefused:
			isReplay[e.Run] = true
		}
	}
	for i := range events {
		e := &events[i]
		if e.Ignored || e.Run == "" || !isReplay[e.Run] || forgedOutcome(e) {
			continue
		}
		switch e.Kind {
		case EventClaimed, EventReplayStarted, EventReplayed, EventReplayFinished, EventReplayRefused,
			EventCancelRequested, EventReplayOutcome:
		default:
			continue
		}
		j := get(e)
		j.Unverified = j.Unverified || !e.Verified
		if e.Quarantine != "" && !slices.Contains(j.Quarantines, e.Quarantine) {
			j.Quarantines = append(j.Quarantines, e.Quarantine)
		}
		if e.Kind != EventReplayOutcome && e.Kind != EventCancelRequested {
			if j.Started.IsZero() || e.At.Before(j.Started) {
				j.Started = e.At
			}
			if j.By == "" {
				j.By, j.Reason, j.Filter = e.By, e.Reason, e.Filter
			}
		}
		switch e.Kind {
		case EventReplayStarted:
			j.Selected = max(j.Selected, e.Counts["selected"])
			j.ToSend += e.Counts["to_send"]
			j.Refused = max(j.Refused, e.Counts["invalid"]+e.Counts["over_budget"]+e.Counts["omitted"])
			if len(e.Windows) > 0 {
				j.Windows = e.Windows
			}
		case EventReplayed:
			for _, id := range e.IDs {
				if _, dup := msgs[e.Run][id]; dup {
					continue
				}
				msgs[e.Run][id] = len(j.Messages)
				j.Messages = append(j.Messages, JobMessage{ID: id, ToQueue: e.ToQueue, Outcome: JobPending})
			}
		case EventReplayOutcome:
			if e.Outcome != JobHandled && e.Outcome != JobQuarantinedAgain {
				continue
			}
			for _, id := range e.IDs {
				k, ok := msgs[e.Run][id]
				if !ok {
					// The outcome can be written before a slow replay's
					// replayed event is read: keep it for that.
					k = len(j.Messages)
					msgs[e.Run][id] = k
					j.Messages = append(j.Messages, JobMessage{ID: id})
				}
				j.Messages[k].Outcome, j.Messages[k].At = e.Outcome, e.At
			}
		case EventCancelRequested:
			j.cancelAsked = true
		case EventReplayFinished:
			j.Finished = e.At
			j.Selected = max(j.Selected, e.Counts["selected"])
			j.Sent = max(j.Sent, e.Counts["published"], e.Counts["sent"])
			switch {
			case e.Counts["stopped"] == 0:
				j.State = JobDone
			case strings.HasPrefix(e.Stop, stopCancelled):
				j.State, j.Stop = JobCancelled, e.Stop
			default:
				j.State, j.Stop = JobStopped, e.Stop
			}
		case EventReplayRefused:
			j.Finished, j.State = e.At, JobStopped
			j.Selected = max(j.Selected, e.Counts["selected"])
			j.Refused = max(j.Refused, len(e.IDs))
			j.Stop = "refused: selected messages fail the current schema (" + fmt.Sprint(len(e.IDs)) + ")"
		}
	}
	out := make([]Job, 0, len(order))
	for _, run := range order {
		j := byRun[run]
		if j.Started.IsZero() {
			continue // only outcomes or a cancel: not a job this reader saw start
		}
		for _, m := range j.Messages {
			switch m.Outcome {
			case JobHandled:
				j.Handled++
			case JobQuarantinedAgain:
				j.QuarantinedAgain++
			default:
				j.Pending++
			}
		}
		// An outcome read before its replayed event still names a message
		// the broker confirmed: the runtime got it.
		j.Confirmed = len(j.Messages)
		j.Sent = max(j.Sent, j.Confirmed)
		out = append(out, *j)
	}
	slices.SortStableFunc(out, func(a, b Job) int { return b.Started.Compare(a.Started) })
	return out
}

// forgedOutcome: e is a replay-outcome event that a reader with the key
// read without a valid signature. Only the runtime writes outcomes, and
// only with the key, so such an event is someone else's even where
// settleEvents counts unsigned events (before a stream's first signed
// one, as older versions wrote them): it must not make a message read as
// handled, nor add a quarantine to the job.
func forgedOutcome(e *Event) bool {
	return e.Kind == EventReplayOutcome && !e.Verified && e.Unverified != unverifiedNoKey
}

// stopCancelled starts the Stop of a replay that a cancel-requested event
// ended.
const stopCancelled = "cancelled"

// ErrCancelled is the cause a replay's context ends with when a
// cancel-requested event names it.
var ErrCancelled = errors.New(stopCancelled + " (quarantine jobs cancel)")

// ErrNoJob: no replay has that id (or a prefix of it).
var ErrNoJob = errors.New("no replay job with that id")

// Jobs reads every quarantine's events stream and returns its replay jobs,
// newest first. A job whose events say it is running is asked about at the
// broker: if no process holds the lock of any of its quarantines, the
// process that ran it ended without finishing (killed, or its connection
// lost), and it is stopped.
func (in *Inspector) Jobs(ctx context.Context) ([]Job, error) {
	events, err := in.Events(ctx)
	if err != nil {
		return nil, err
	}
	jobs := jobsOf(events)
	return jobs, in.CheckRunning(jobs)
}

// Jobs returns the replay jobs s's events tell of, newest first, as
// Inspector.Jobs does but without asking the broker about those whose
// events say they run (Inspector.CheckRunning does).
func (s *Snapshot) Jobs() []Job { return jobsOf(s.Events) }

// CheckRunning asks the broker about each of jobs whose events say it is
// running: if no process holds the replay lock of any of its quarantines,
// the process that ran it ended without finishing (killed, or its
// connection lost), and it is stopped.
func (in *Inspector) CheckRunning(jobs []Job) error {
	for i := range jobs {
		j := &jobs[i]
		if j.State != JobRunning {
			continue
		}
		held := false
		for _, q := range j.Quarantines {
			h, err := lockHeld(in.Conn, q)
			if err != nil {
				return err
			}
			held = held || h
		}
		if !held {
			j.State, j.Stop = JobStopped, "its process ended before it finished (no process holds the replay lock)"
			if j.cancelAsked {
				j.State, j.Stop = JobCancelled, stopCancelled+"; its process ended before it wrote its end"
			}
		}
	}
	return nil
}

// Events reads every quarantine's events stream (to its end, as a listing
// does), checked with Verifier, merged in time order.
func (in *Inspector) Events(ctx context.Context) ([]Event, error) {
	sets := in.quarantines()
	per := make([][]Event, len(sets))
	errs := make([]error, len(sets))
	var wg sync.WaitGroup
	for i, s := range sets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := s.cfg.Quarantine.EventsStream()
			per[i], errs[i] = readEvents(ctx, in.Conn, stream, in.eventWaits, "", in.Verifier)
			for k := range per[i] {
				per[i][k].Quarantine = s.cfg.Quarantine.Queue
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return mergeEvents(per), nil
}

// FindJob returns the job with id, or the one job whose id starts with it
// (at least 4 characters).
func FindJob(jobs []Job, id string) (*Job, error) {
	var hit *Job
	for i := range jobs {
		switch {
		case jobs[i].ID == id:
			return &jobs[i], nil
		case len(id) >= 4 && strings.HasPrefix(jobs[i].ID, id):
			if hit != nil {
				return nil, fmt.Errorf("%w: %q", ErrAmbiguous, id)
			}
			hit = &jobs[i]
		}
	}
	if hit == nil {
		return nil, fmt.Errorf("%w: %q", ErrNoJob, id)
	}
	return hit, nil
}

// lockHeld asks the broker whether a process holds intake's replay lock:
// a passive declare of the exclusive queue is refused as locked when
// another connection holds it, and as not found when nobody does.
func lockHeld(conn *amqp.Connection, intake string) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	_, err = ch.QueueDeclarePassive(intake+".replay-lock", false, true, true, false, nil)
	if err == nil {
		_ = ch.Close()
		return true, nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.ResourceLocked:
			return true, nil
		case amqp.NotFound:
			return false, nil
		}
	}
	return false, fmt.Errorf("ask whether %s.replay-lock is held: %w", intake, err)
}

// CancelJob asks the running replay id (or an id prefix) to stop after the
// message in flight: a cancel-requested event in each of its quarantines'
// events streams, which the replay watches. The rest of its records stay
// open. It returns the job as read before the request.
func (rp *Replayer) CancelJob(ctx context.Context, id, reason string) (*Job, error) {
	in := &Inspector{Conn: rp.Conn, Config: rp.Config, Now: rp.Now, Verifier: rp.Signer, eventWaits: rp.eventWaits, OmitBodies: true}
	jobs, err := in.Jobs(ctx)
	if err != nil {
		return nil, err
	}
	j, err := FindJob(jobs, id)
	if err != nil {
		return nil, err
	}
	if j.State != JobRunning {
		return j, fmt.Errorf("job %s is not running: %s", j.ID, j.State)
	}
	pub, err := amqpx.NewPublisher(rp.Conn)
	if err != nil {
		return j, err
	}
	defer pub.Close()
	e := Event{Kind: EventCancelRequested, At: rp.now().UTC(), By: rp.by(), Run: j.ID, Reason: reason}
	for _, q := range j.Quarantines {
		if err := publishEvent(ctx, pub, rp.Signer, intakeEvents(rp.Config, q), e); err != nil {
			return j, fmt.Errorf("cancel %s: %w", j.ID, err)
		}
	}
	return j, nil
}

// watchCancel ends the replay run's context, with cause ErrCancelled,
// when a cancel-requested event naming it (signed, with the key) arrives
// in one of streams: each is read from a little before now, so an event
// written after the run's claim is seen. It returns a stop for the
// watchers.
func (rp *Replayer) watchCancel(ctx context.Context, cancel context.CancelCauseFunc, run string, streams []string) func() {
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	from := rp.now().Add(-2 * time.Second)
	for _, stream := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = consumeFrom(wctx, rp.Conn, stream, from, func(_ int64, d *amqp.Delivery) error {
				if !strings.Contains(string(d.Body), run) {
					return nil
				}
				var e Event
				if json.Unmarshal(d.Body, &e) != nil || e.Kind != EventCancelRequested || e.Run != run {
					return nil
				}
				if rp.Signer != nil && !rp.Signer.VerifyEvent(stream, d.Body, d.Headers).Valid {
					return nil
				}
				cancel(ErrCancelled)
				return errStopRead
			})
		}()
	}
	return func() { stop(); wg.Wait() }
}

// RecordOutcome writes what became of messages the replay run sent (ids:
// their records; outcome JobHandled or JobQuarantinedAgain), as the
// runtime settled them on queue, into the events stream of queue's
// quarantine, signed. Readers with the key count it only signed: a
// producer cannot make a message read as handled.
func (rp *Replayer) RecordOutcome(ctx context.Context, queue, run, outcome string, ids []string) error {
	qc, ok := rp.Config.QueueByName(queue)
	if !ok {
		return fmt.Errorf("record outcome: queue %q is not in the config", queue)
	}
	pub, err := amqpx.NewPublisher(rp.Conn)
	if err != nil {
		return err
	}
	defer pub.Close()
	by := rp.by()
	for from := 0; from < len(ids); from += purgeChunk {
		e := Event{Kind: EventReplayOutcome, At: rp.now().UTC(), By: by, Run: run, Outcome: outcome,
			IDs: ids[from:min(from+purgeChunk, len(ids))]}
		if err := publishEvent(ctx, pub, rp.Signer, qc.Quarantine.EventsStream(), e); err != nil {
			return err
		}
	}
	return nil
}
