package topology

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DeleteOptions says how far Delete may go.
type DeleteOptions struct {
	// DryRun checks every object and reports what Delete would do, and
	// deletes nothing.
	DryRun bool
	// IncludeData also deletes queues that hold messages, and the
	// quarantine's streams (the quarantine records and their audit trail).
	// Defaults to false: those are kept and reported.
	IncludeData bool
	// WithoutManagement lets Delete run without the management API. Only
	// the management API shows an object of another type under a config's
	// name (another application's, which a passive declare accepts) and
	// bindings from outside the topology into its queues (a config that
	// shares the quarantine): without it those are deleted when empty.
	// Defaults to false: Delete refuses (ErrDeleteNeedsManagement), and so
	// does a dry run, which shows what the delete would do.
	WithoutManagement bool
	// Retired deletes only the per-queue retry exchanges and lanes that
	// queues on the shared tiers no longer use (Topology.Retired), each
	// only once it is empty (IncludeData does not apply): what waits in a
	// lane still returns to its work queue. Defaults to false: the whole
	// topology, the retired objects that are left included.
	Retired bool
}

// ErrDeleteNeedsManagement: Delete was asked to delete (or to dry-run a
// delete) without the management API and without
// DeleteOptions.WithoutManagement. When UseManagement failed, Delete's
// error wraps it and names the cause (the API did not answer, or is
// another broker's).
var ErrDeleteNeedsManagement = errors.New("deleting needs the management API (broker.management_url) to tell the config's objects from other applications' under the same names; --without-management deletes without those checks (with --dry-run: shows what that would delete)")

// mgmtRefusal is ErrDeleteNeedsManagement when broker.management_url is
// set but its API did not answer, or answers for another broker.
type mgmtRefusal struct{ cause error }

func (e *mgmtRefusal) Error() string {
	what := "did not answer"
	if errors.Is(e.cause, ErrOtherBroker) {
		what = "is another broker's"
	}
	return fmt.Sprintf("the management API (broker.management_url) %s: %v; deleting needs it to tell the config's objects from other applications' under the same names; --without-management deletes without those checks (with --dry-run: shows what that would delete)", what, e.cause)
}

// Unwrap gives both: errors.Is matches ErrDeleteNeedsManagement and the
// cause (ErrOtherBroker, a dial error).
func (e *mgmtRefusal) Unwrap() []error { return []error{ErrDeleteNeedsManagement, e.cause} }

// DeleteAction is what Delete did (or, in a dry run, would do) with one
// object.
type DeleteAction string

const (
	DeleteDeleted DeleteAction = "deleted"
	DeleteWould   DeleteAction = "would delete"
	DeleteKept    DeleteAction = "kept"
	DeleteAbsent  DeleteAction = "absent"
)

// DeleteStep is one queue or exchange of the topology.
type DeleteStep struct {
	Kind   Kind         `json:"kind"`
	Object string       `json:"object"`
	Action DeleteAction `json:"action"`
	// Messages is the queue's ready message count from a passive declare
	// (-1 for a stream: AMQP cannot count one reliably).
	Messages int `json:"messages"`
	// Consumers is the passive declare's count; for a stream, which that
	// always counts 0, the management API's (when it is used).
	Consumers int `json:"consumers"`
	// Reason says why an object is kept.
	Reason string `json:"reason,omitempty"`
}

// DeleteSummary counts steps by action. A dry run deletes nothing: it
// counts what it would delete in WouldDelete, and Deleted is 0.
type DeleteSummary struct {
	Deleted     int `json:"deleted"`
	WouldDelete int `json:"would_delete"`
	Kept        int `json:"kept"`
	Absent      int `json:"absent"`
}

// DeleteReport is what Delete found and did.
type DeleteReport struct {
	BrokerVersion string        `json:"broker_version"`
	DryRun        bool          `json:"dry_run"`
	IncludeData   bool          `json:"include_data"`
	Steps         []DeleteStep  `json:"steps"`
	Summary       DeleteSummary `json:"summary"`
	// Failed is the step a broker error stopped Delete at, with Delete's
	// error: Steps holds what was done before it, and no object after it
	// was deleted. Nil when Delete ran to the end.
	Failed *DeleteFailure `json:"failed,omitempty"`
}

// DeleteFailure is the step that stopped a Delete.
type DeleteFailure struct {
	Kind   Kind   `json:"kind"`
	Object string `json:"object"`
	// Step is "check" (every queue is checked before any is deleted, so a
	// failed queue check deletes nothing) or "delete".
	Step string `json:"step"`
	// Error is the broker's (or the management API's) error.
	Error string `json:"error"`
}

// Steps of a DeleteFailure.
const (
	DeleteStepCheck  = "check"
	DeleteStepDelete = "delete"
)

// stop records the step that failed and returns its error, naming the
// step; err may already name the object.
func (r *DeleteReport) stop(kind Kind, object, step string, err error) error {
	if u := errors.Unwrap(err); u != nil && strings.HasPrefix(err.Error(), object+": ") {
		err = u
	}
	r.Failed = &DeleteFailure{Kind: kind, Object: object, Step: step, Error: err.Error()}
	return fmt.Errorf("%s %s: %w", step, object, err)
}

// OK reports whether nothing was (or would be) kept.
func (r *DeleteReport) OK() bool { return r.Summary.Kept == 0 }

// Kept names the kept objects.
func (r *DeleteReport) Kept() []string {
	var ks []string
	for _, s := range r.Steps {
		if s.Action == DeleteKept {
			ks = append(ks, s.Object)
		}
	}
	return ks
}

func (r *DeleteReport) add(s DeleteStep) {
	r.Steps = append(r.Steps, s)
	switch s.Action {
	case DeleteDeleted:
		r.Summary.Deleted++
	case DeleteWould:
		r.Summary.WouldDelete++
	case DeleteKept:
		r.Summary.Kept++
	case DeleteAbsent:
		r.Summary.Absent++
	}
}

// Delete deletes the queues and exchanges of t, and nothing else: queues
// first (which removes their bindings), then exchanges.
//
// Data is kept unless opts.IncludeData: a queue whose passive declare
// counts messages, and every stream (the quarantine's records and events:
// a stream's count over AMQP lags, 0 right after a publish, so emptiness
// cannot be proven). The broker's own guards cannot be used for this:
// queue.delete with if-empty or if-unused is refused on quorum queues with
// 540 NOT_IMPLEMENTED, which closes the whole connection, and is ignored on
// streams, which are deleted with their data (seen on 3.10.8). So the check
// and the delete are two steps: stop producers and the bridge first. A
// queue with consumers is always kept (a stream's readers only the
// management API counts, seconds late), and so is a queue that a kept queue
// dead-letters into by name (a retry lane's work queue), and everything a
// kept work queue's runtime publishes to or that routes back to it (its
// retry and dead-letter exchanges, retry lanes, quarantine intake and
// streams: a running bridge's retries would fail), and, with the
// management API, a queue bound from an exchange outside the topology (a
// quarantine another config shares). Every queue is
// checked before any is deleted. With the management API, a queue or
// exchange of another type than the config's under its name is kept: it is
// not the config's (a passive declare ignores the type).
//
// Without the management API, Delete (a dry run too) refuses unless
// opts.WithoutManagement. A broker error stops it where it happens:
// the report then has the steps done before it and Failed.
//
// An exchange is deleted with if-unused, so one that still routes to a
// queue outside the topology (another consumer bound to E) is kept; so is
// the dead-letter exchange of a kept queue. Each delete runs on its own
// channel, since a refused one closes it. Deleting what is absent is not
// an error.
func (in *Broker) Delete(ctx context.Context, t *Topology, opts DeleteOptions) (*DeleteReport, error) {
	// A dry run refuses like the delete it previews: "would delete" from
	// a command that would refuse is not what would happen.
	if in.Mgmt == nil && !opts.WithoutManagement {
		if in.mgmtErr != nil {
			return nil, &mgmtRefusal{in.mgmtErr}
		}
		return nil, ErrDeleteNeedsManagement
	}
	retired := map[string]bool{} // "queue name" / "exchange name"
	if t.Retired != nil {
		for _, q := range t.Retired.Queues {
			retired["queue "+q.Name] = true
		}
		for _, x := range t.Retired.Exchanges {
			retired["exchange "+x.Name] = true
		}
	}
	if opts.Retired {
		opts.IncludeData = false
		if t.Retired == nil {
			t = &Topology{Broker: t.Broker}
		} else {
			t = t.Retired
		}
	} else {
		t = t.withRetired()
	}
	r := &DeleteReport{BrokerVersion: t.Broker.String(), DryRun: opts.DryRun, IncludeData: opts.IncludeData}
	steps := make([]DeleteStep, len(t.Queues))
	index := map[string]int{}
	sharedUse, err := in.sharedInUse(ctx, t)
	if err != nil {
		return r, r.stop(KindExchange, exchangeObject(t.sharedExchanges().ret), DeleteStepCheck, err)
	}
	for i, q := range t.Queues {
		if err := ctx.Err(); err != nil {
			return r, r.stop(KindQueue, queueObject(q.Name), DeleteStepCheck, err)
		}
		s, err := in.checkQueue(ctx, t, q, opts)
		if err != nil {
			return r, r.stop(KindQueue, s.Object, DeleteStepCheck, err)
		}
		if q.Owner == "" && sharedUse != "" && s.Action == DeleteWould {
			s.Action, s.Reason = DeleteKept, sharedUse
		}
		steps[i], index[q.Name] = s, i
	}
	// A kept queue that dead-letters through the default exchange (a retry
	// lane, back to its work queue) keeps its target: its messages return
	// there.
	for changed := true; changed; {
		changed = false
		for i, q := range t.Queues {
			dlx, ok := q.Args[ArgDeadLetterExchange].(string)
			target, _ := q.Args[ArgDeadLetterRK].(string)
			j, known := index[target]
			if steps[i].Action != DeleteKept || !ok || dlx != "" || !known || steps[j].Action != DeleteWould {
				continue
			}
			steps[j].Action, steps[j].Reason = DeleteKept, fmt.Sprintf("kept %s dead-letters into it", queueObject(q.Name))
			changed = true
		}
	}
	// The converse: a kept work queue (in use by a running bridge, or kept
	// for any other reason) keeps everything the runtime publishes to on
	// its behalf or that routes back to it: its retry exchange and lanes,
	// its dead-letter exchange, and its quarantine's intake and streams.
	// Deleting them under a running bridge fails its retries (NOT_FOUND)
	// and ends transient failures quarantined as crash loops.
	needed := map[string]string{} // exchange: why it is kept
	for _, w := range t.Work {
		i, known := index[w.Name]
		if !known || steps[i].Action != DeleteKept {
			continue
		}
		why := fmt.Sprintf("work %s is kept", queueObject(w.Name))
		if steps[i].Consumers > 0 {
			why += " (in use)"
		}
		serves := []string{w.Quarantine, w.Records, w.Events}
		for _, tier := range w.Tiers {
			for _, l := range tier.Lanes {
				serves = append(serves, l.Queue)
			}
		}
		for _, n := range serves {
			if j, known := index[n]; known && steps[j].Action == DeleteWould {
				steps[j].Action, steps[j].Reason = DeleteKept, why
			}
		}
		for _, x := range []string{w.RetryExchange, w.DeadExchange, w.ReturnExchange} {
			if _, ok := needed[x]; x != "" && !ok {
				needed[x] = why
			}
		}
	}
	// A kept shared tier still returns what it holds through the return
	// exchange, and what finds no work queue there (one this delete
	// removes) lands in the catch-all: keep it too.
	if catchAll := t.sharedExchanges().catchAll; catchAll != "" {
		for i, q := range t.Queues {
			j, known := index[catchAll]
			if q.Role == RoleRetry && q.Owner == "" && steps[i].Action == DeleteKept && known && steps[j].Action == DeleteWould {
				steps[j].Action, steps[j].Reason = DeleteKept, fmt.Sprintf("kept %s may still return messages that no work queue takes", queueObject(q.Name))
			}
		}
	}
	keptQueue := map[string]bool{}
	for i, q := range t.Queues {
		s := steps[i]
		if s.Action == DeleteWould && !opts.DryRun {
			// Never if-empty or if-unused: see above.
			err := withChannel(in.Conn, func(ch *amqp.Channel) error {
				_, err := ch.QueueDelete(q.Name, false, false, false)
				return err
			})
			if err != nil {
				return r, r.stop(KindQueue, s.Object, DeleteStepDelete, err)
			}
			s.Action = DeleteDeleted
		}
		if s.Action == DeleteKept {
			keptQueue[q.Name] = true
		}
		if s.Action == DeleteAbsent && retired["queue "+q.Name] {
			continue // never declared, or drained and deleted: nothing to say
		}
		r.add(s)
	}
	// An exchange that leads to a kept queue stays: a binding to it (if-
	// unused refuses anyway) or its dead-letter exchange (not a binding).
	feeds := map[string]string{}
	for _, b := range t.Bindings {
		if keptQueue[b.Queue] {
			feeds[b.Exchange] = b.Queue
		}
	}
	for _, q := range t.Queues {
		if dlx, ok := q.Args[ArgDeadLetterExchange].(string); ok && dlx != "" && keptQueue[q.Name] {
			feeds[dlx] = q.Name
		}
	}
	// The return exchange's alternate exchange goes with it.
	for _, x := range t.Exchanges {
		if ae, ok := x.Args[ArgAlternateExchange].(string); ok && ae != "" && (needed[x.Name] != "" || feeds[x.Name] != "") {
			if _, set := needed[ae]; !set {
				needed[ae] = fmt.Sprintf("the alternate exchange of kept %s", exchangeObject(x.Name))
			}
		}
	}
	for _, x := range t.Exchanges {
		if err := ctx.Err(); err != nil {
			return r, r.stop(KindExchange, exchangeObject(x.Name), DeleteStepCheck, err)
		}
		why := needed[x.Name]
		if why == "" && feeds[x.Name] != "" {
			why = fmt.Sprintf("leads to kept %s", queueObject(feeds[x.Name]))
		}
		if why == "" && x.Owner == "" && sharedUse != "" {
			why = sharedUse
		}
		s, step, err := in.deleteExchange(ctx, t, x, why, keptQueue, opts)
		if err != nil {
			return r, r.stop(KindExchange, s.Object, step, err)
		}
		if s.Action == DeleteAbsent && retired["exchange "+x.Name] {
			continue
		}
		r.add(s)
	}
	return r, nil
}

// withRetired is t with the retired per-queue objects added after its own
// (lanes with the queues, their exchanges with the exchanges), so that a
// whole delete leaves none behind.
func (t *Topology) withRetired() *Topology {
	if t.Retired == nil {
		return t
	}
	out := *t
	out.Queues = append(slices.Clip(t.Queues), t.Retired.Queues...)
	out.Exchanges = append(slices.Clip(t.Exchanges), t.Retired.Exchanges...)
	out.Bindings = append(slices.Clip(t.Bindings), t.Retired.Bindings...)
	out.Retired = nil
	return &out
}

// sharedInUse says why the shared tiers' objects must stay, or "": with the
// management API, the return exchange binding a queue that is not one of
// t's work queues (another config's on the vhost, which retries through
// the same tiers). Without it, nothing can tell.
func (in *Broker) sharedInUse(ctx context.Context, t *Topology) (string, error) {
	ret := t.sharedExchanges().ret
	if ret == "" || in.Mgmt == nil {
		return "", nil
	}
	bs, err := in.Mgmt.ExchangeBindings(ctx, ret)
	if errors.Is(err, ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	ours := map[string]bool{}
	for _, w := range t.Work {
		ours[w.Name] = true
	}
	var others []string
	for _, b := range bs {
		if b.DestinationType != "queue" || !ours[b.Destination] {
			others = append(others, b.DestinationType+" "+foreignName(b.Destination))
		}
	}
	if len(others) == 0 {
		return "", nil
	}
	slices.Sort(others)
	return fmt.Sprintf("the shared tiers also serve %s (bound to %s outside the config)", strings.Join(slices.Compact(others), ", "), exchangeObject(ret)), nil
}

// checkQueue says whether q is kept (and why), absent, or to be deleted
// (DeleteWould).
func (in *Broker) checkQueue(ctx context.Context, t *Topology, q QueueSpec, opts DeleteOptions) (DeleteStep, error) {
	s := DeleteStep{Kind: KindQueue, Object: queueObject(q.Name)}
	var st amqp.Queue
	err := withChannel(in.Conn, func(ch *amqp.Channel) error {
		var err error
		st, err = ch.QueueDeclarePassive(q.Name, true, false, false, false, nil)
		return err
	})
	if pr, _, err := classify(s.Object, err); err != nil {
		return s, err
	} else if pr == probeMissing {
		s.Action = DeleteAbsent
		return s, nil
	}
	s.Messages, s.Consumers = st.Messages, st.Consumers
	stream := q.queueType() == QueueTypeStream
	var other string // the broker's queue type, when it is not the config's
	var routed []string
	if in.Mgmt != nil {
		// Another application (a config sharing the quarantine) may route
		// into the queue: deleting it would drop what it sends.
		// A check that fails keeps the queue: fail closed.
		bs, err := in.Mgmt.QueueBindings(ctx, q.Name)
		if err != nil {
			s.Action, s.Reason = DeleteKept, "the management API could not list its bindings: "+err.Error()
			return s, nil
		}
		routed = foreignSources(bs, t)
		// The config may say quorum where the broker has a stream.
		mq, err := in.Mgmt.Queue(ctx, q.Name)
		if err != nil {
			s.Action, s.Reason = DeleteKept, "the management API could not read it: "+err.Error()
			return s, nil
		}
		stream = stream || mq.Type == QueueTypeStream
		if mq.Type != "" && mq.Type != q.queueType() {
			other = mq.Type
		}
		if stream {
			// A passive declare counts no stream consumers (3.10.8, 4.0.5):
			// a reader of the quarantine's records shows only here.
			s.Consumers = max(s.Consumers, mq.ConsumerCount())
		}
	}
	if stream {
		s.Messages = -1
	}
	switch {
	case other != "":
		// A passive declare ignores the type: only the management API
		// shows that this is another application's queue under our name.
		s.Action, s.Reason = DeleteKept, fmt.Sprintf("a %s queue where the config has a %s one: not the config's (topology plan shows the conflict)", other, q.queueType())
		return s, nil
	case len(routed) > 0:
		s.Action, s.Reason = DeleteKept, "bound from "+strings.Join(routed, ", ")+" outside the topology"
		return s, nil
	case s.Consumers > 0 && stream:
		s.Action, s.Reason = DeleteKept, fmt.Sprintf("%d consumer(s) attached, as the management API counts a stream's readers (seconds late): stop them (the bridge, quarantine readers) first", s.Consumers)
		return s, nil
	case s.Consumers > 0:
		s.Action, s.Reason = DeleteKept, fmt.Sprintf("%d consumer(s) attached: stop them (the bridge) first", s.Consumers)
		return s, nil
	case stream && !opts.IncludeData:
		// A stream's records are the quarantine's data even when read:
		// kept, whatever the message count says.
		s.Action, s.Reason = DeleteKept, "a stream: it holds the quarantine's records or their audit trail; --include-data deletes it"
		return s, nil
	case s.Messages > 0 && !opts.IncludeData:
		s.Action, s.Reason = DeleteKept, fmt.Sprintf("holds %d message(s); --include-data deletes it", s.Messages)
		return s, nil
	}
	s.Action = DeleteWould
	return s, nil
}

// deleteExchange checks x and deletes it unless opts.DryRun or keep (why
// the topology needs it) is set; on an error, step says which of the two
// failed.
func (in *Broker) deleteExchange(ctx context.Context, t *Topology, x ExchangeSpec, keep string, keptQueue map[string]bool, opts DeleteOptions) (_ DeleteStep, step string, _ error) {
	s := DeleteStep{Kind: KindExchange, Object: exchangeObject(x.Name)}
	err := withChannel(in.Conn, func(ch *amqp.Channel) error { return declareExchange(ch, x, passive) })
	if pr, _, err := classify(s.Object, err); err != nil {
		return s, DeleteStepCheck, err
	} else if pr == probeMissing {
		s.Action = DeleteAbsent
		return s, "", nil
	}
	if in.Mgmt != nil {
		// A passive declare ignores the type, as for queues.
		mx, err := in.Mgmt.Exchange(ctx, x.Name)
		if err != nil { // fail closed, as for queues
			s.Action, s.Reason = DeleteKept, "the management API could not read it: "+err.Error()
			return s, "", nil
		}
		if mx.Type != "" && x.Kind != "" && mx.Type != x.Kind {
			s.Action, s.Reason = DeleteKept, fmt.Sprintf("a %s exchange where the config has a %s one: not the config's (topology plan shows the conflict)", mx.Type, x.Kind)
			return s, "", nil
		}
	}
	if keep != "" {
		s.Action, s.Reason = DeleteKept, keep
		return s, "", nil
	}
	if opts.DryRun {
		// The delete itself needs no list of bindings (if-unused keeps an
		// exchange in use): without one, say what it would do.
		s.Action = DeleteWould
		if in.Mgmt == nil {
			s.Reason = "unless a queue outside the topology is bound to it (AMQP cannot list bindings)"
			return s, "", nil
		}
		bs, err := in.Mgmt.ExchangeBindings(ctx, x.Name)
		if err != nil {
			s.Reason = "unless a queue outside the topology is bound to it (the management API could not list its bindings: " + err.Error() + ")"
			return s, "", nil
		}
		ours := map[string]bool{}
		for _, q := range t.Queues {
			ours[q.Name] = !keptQueue[q.Name]
		}
		if other := foreignBindings(bs, ours); len(other) > 0 {
			s.Action, s.Reason = DeleteKept, "in use: bound to "+strings.Join(other, ", ")
		}
		return s, "", nil
	}
	err = withChannel(in.Conn, func(ch *amqp.Channel) error {
		const ifUnused, noWait = true, false
		return ch.ExchangeDelete(x.Name, ifUnused, noWait)
	})
	var ae *amqp.Error
	switch {
	case err == nil:
		s.Action = DeleteDeleted
	case errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed:
		s.Action, s.Reason = DeleteKept, "in use: something outside the topology is bound to it"
		if in.Mgmt != nil {
			if bs, err := in.Mgmt.ExchangeBindings(ctx, x.Name); err == nil {
				if other := foreignBindings(bs, nil); len(other) > 0 {
					s.Reason = "in use: bound to " + strings.Join(other, ", ")
				}
			}
		}
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		s.Action = DeleteAbsent
	default:
		return s, DeleteStepDelete, err
	}
	return s, "", nil
}

// foreignBindings names the destinations of bs that gone does not mark as
// about to be deleted.
func foreignBindings(bs []MgmtBinding, gone map[string]bool) []string {
	var out []string
	for _, b := range bs {
		if b.DestinationType == "queue" && gone[b.Destination] {
			continue
		}
		out = append(out, b.DestinationType+" "+foreignName(b.Destination))
	}
	return out
}

// foreignSources names the exchanges of bs (a queue's bindings) that t does
// not declare; the default exchange's binding is every queue's.
func foreignSources(bs []MgmtBinding, t *Topology) []string {
	ours := map[string]bool{"": true}
	for _, x := range t.Exchanges {
		ours[x.Name] = true
	}
	var out []string
	for _, b := range bs {
		if !ours[b.Source] {
			out = append(out, "exchange "+foreignName(b.Source))
		}
	}
	slices.Sort(out)
	return slices.Compact(out) // one per exchange, whatever its keys
}

// foreignName quotes a name the config did not give (config names are
// plain): as 'name', or as an escaped Go string literal when it holds
// anything unprintable, so it cannot drive the terminal it is shown on.
func foreignName(n string) string {
	if q := strconv.Quote(n); q[1:len(q)-1] != n {
		return q
	}
	return "'" + n + "'"
}

// WriteText renders the report: one line per object, then the counts.
func (r *DeleteReport) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "broker %s\n", r.BrokerVersion)
	for _, s := range r.Steps {
		line := fmt.Sprintf("  %-12s %s", s.Action, s.Object)
		if s.Kind == KindQueue && s.Action != DeleteAbsent {
			if s.Messages >= 0 {
				line += fmt.Sprintf(" (%d message(s))", s.Messages)
			} else {
				line += " (stream)"
			}
		}
		if s.Reason != "" {
			line += ": " + s.Reason
		}
		b.WriteString(line + "\n")
	}
	if f := r.Failed; f != nil {
		fmt.Fprintf(&b, "  %-12s %s: %s: %s\n", "failed", f.Object, f.Step, f.Error)
	}
	n, verb, cmd := r.Summary.Deleted, "deleted", "delete"
	if r.DryRun {
		n, verb, cmd = r.Summary.WouldDelete, "would delete", "delete --dry-run"
	}
	fmt.Fprintf(&b, "%s: %d %s, %d kept, %d absent", cmd, n, verb, r.Summary.Kept, r.Summary.Absent)
	switch {
	case r.Failed == nil:
	case r.Failed.Step == DeleteStepCheck && r.Failed.Kind == KindQueue:
		b.WriteString("; stopped at the failed check: nothing was deleted")
	default:
		fmt.Fprintf(&b, "; stopped at %s: what follows it was not checked or deleted", r.Failed.Object)
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}
