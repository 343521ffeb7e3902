package quarantine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/user"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Errors a replay or purge refuses with. Nothing was sent or resolved.
var (
	// ErrNoSelector: the filter selects everything. Replay and purge need
	// an explicit selection (ids, queue, class, reason, fingerprint,
	// type/version, time range or error text), never "all".
	ErrNoSelector = errors.New("refused: give a selector (--id, --queue, --class, --reason-contains, --fingerprint, --type, --version, --since, --until or --error); replay and purge never select everything")
	// ErrInvalid: some selected messages fail the current schema and would
	// be quarantined again (see ReplayResult.Invalid; --skip-invalid leaves
	// them out).
	ErrInvalid = errors.New("refused: some selected messages fail the current schema and would be quarantined again (--skip-invalid leaves them out; each refusal names the repair: --patch, --replace-body, --set-header, --set-type or --set-version)")
	// ErrNoReason: purge needs a reason.
	ErrNoReason = errors.New("refused: a purge needs a reason")
	// ErrLocked: another replay or purge of the same quarantine holds its
	// lock, and LockWait ran out.
	ErrLocked = errors.New("another replay or purge of this quarantine is running")
)

// ReplayOptions say what to replay and how.
type ReplayOptions struct {
	// Filter selects open records; it must have a selector.
	Filter Filter
	// ToQueue overrides where messages go (default: each record's own work
	// queue, through the default exchange, so no other queue bound to the
	// original exchange gets a copy).
	ToQueue string
	// DryRun reports what would move and sends nothing.
	DryRun bool
	// Max caps how many are sent (0: no cap).
	Max int
	// Rate paces sending, messages per second (0: unpaced). A rate below
	// MinRate, negative or not finite is refused: its interval would not
	// fit a time.Duration and the replay would run unpaced.
	Rate float64
	// Reason is recorded in each message and the audit trail.
	Reason string
	// SkipInvalid leaves out messages that fail the current schema instead
	// of refusing the replay.
	SkipInvalid bool
	// Patch repairs each message's body, headers or type (see Patch)
	// before the schema check; it is written into the audit trail.
	Patch *Patch
	// Progress, when set, is called after each message sent.
	Progress func(p Progress)
	// Archive, when set, is where the records come from (see ReadArchive)
	// instead of the records stream: Filter selects among them, and a
	// record that an event in the live quarantine marks replayed or purged
	// is not selected. Every other rule is a replay's: the lock, the
	// schema check, the redrive budget, signatures only where the key
	// verifies the envelope, pacing and the audit events.
	Archive *Archive
	// Started, when set, is called once sending begins (after the
	// replay-started events, never in a dry run), with the plan: the run
	// is the job's id (quarantine jobs), and the replay goes on until it
	// has sent everything, ctx ends, or a cancel-requested event names
	// it.
	Started func(res *ReplayResult)

	// auto, for Redrive: the records are its outages' (see autoSelect).
	auto *autoSelect
	// ramp, for Redrive, paces on a ramp instead of Rate.
	ramp *ramp
}

// Progress is a replay's state after each message.
type Progress struct {
	Done, Total int
	Rate        float64 // messages per second so far
	ETA         time.Duration
}

// Planned is one selected record and what replay does with it.
type Planned struct {
	ID      string `json:"id"`
	ToQueue string `json:"to_queue"`
	// Redrives is the count the message will carry.
	Redrives int `json:"redrive_count"`
	// Refused says why it is not sent ("" if it is).
	Refused string `json:"refused,omitempty"`
}

// ReplayResult is what a replay did (or, dry run, would do).
type ReplayResult struct {
	Run      string    `json:"run"`
	DryRun   bool      `json:"dry_run"`
	Selected int       `json:"selected"`
	Plan     []Planned `json:"plan"`
	// Sent are the ids sent and marked replayed, in order.
	Sent []string `json:"sent"`
	// Invalid are ids that fail the current schema; OverBudget ids that
	// used up their redrives (never sent).
	Invalid    []string `json:"invalid,omitempty"`
	OverBudget []string `json:"over_budget,omitempty"`
	// Stopped: the context ended, a cancel-requested event named the
	// run, or a send failed, before every message was sent and marked;
	// Stop says why.
	Stopped bool   `json:"stopped"`
	Stop    string `json:"stop,omitempty"`
	// Duration is how long the replay took.
	Duration Seconds `json:"duration_seconds"`
}

// Replayer replays and purges records. One per command.
type Replayer struct {
	// Conn publishes and holds the lock. Required.
	Conn *amqp.Connection
	// Config and Registry give the queues, their schemas and budgets.
	// Required.
	Config   *config.Config
	Registry *schemas.Registry
	// By names the operator in the audit trail. Defaults to user@host.
	By string
	// LockWait is how long to wait for another replay or purge of the same
	// quarantine to finish. Defaults to 0 (fail at once with ErrLocked).
	LockWait time.Duration
	// TracerProvider makes the replay spans (linked to each message's
	// original trace). Defaults to the global provider.
	TracerProvider trace.TracerProvider
	// Metrics, when set, counts replays and purges.
	Metrics *Metrics
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Signer, with the consumers' signing key, signs the origin headers a
	// replayed message keeps (the exchange and routing key it was first
	// published with), so the runtime trusts them if it fails again; only
	// for a record whose envelope signature verifies with the same key
	// (the runtime wrote it). Without it, or for any other record (a broker
	// dead letter, a forged or an unsigned envelope), the runtime ignores
	// them (and notes it): the message's origin is then where the replay
	// sent it. It also signs the redrive count every replayed message
	// carries (see trustedRedrives), and counts a record's prior replays
	// only from a count a signature vouches for; without it the record's
	// count counts as stored, unverified. It signs every event the
	// Replayer writes, and checks the events it reads (as
	// Inspector.Verifier): once a stream holds a signed event, readers
	// with the key ignore the unsigned events of a Replayer without it,
	// so that records it replayed or purged look open to them. Defaults
	// to nil.
	Signer *triage.Signer

	// eventWaits: see Inspector.eventWaits (tests).
	eventWaits streamWaits
	// selected, if set, is shown the snapshot a replay selects from,
	// under its lock (tests).
	selected func(*Snapshot)
	// expiryNamed: the records RecordExpiries named that were still in
	// the stream at its last call.
	expiryMu    sync.Mutex
	expiryNamed map[string]bool
}

func (rp *Replayer) now() time.Time {
	if rp.Now != nil {
		return rp.Now()
	}
	return time.Now()
}

func (rp *Replayer) by() string {
	if rp.By != "" {
		return rp.By
	}
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

func newRun() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Replay sends the selected open records back, one at a time: published
// with mandatory and confirmed first, then marked replayed in the events
// stream, so a crash in between gives a duplicate, never a loss. It holds
// the lock of every quarantine the filter can touch (an exclusive queue on
// the broker, released with the connection even if the process is killed)
// and reads the open set only after taking it, so two replays of the same
// records never both send one.
func (rp *Replayer) Replay(ctx context.Context, opts ReplayOptions) (*ReplayResult, error) {
	if !opts.Filter.HasSelector() {
		return nil, ErrNoSelector
	}
	if r := opts.Rate; math.IsNaN(r) || math.IsInf(r, 0) || r < 0 || (r > 0 && r < MinRate) {
		return nil, fmt.Errorf("refused: a replay rate must be 0 (unpaced) or between %g and any finite number of messages per second, not %g", MinRate, r)
	}
	if opts.Patch != nil {
		if err := opts.Patch.Check(); err != nil {
			return nil, fmt.Errorf("refused: patch: %w", err)
		}
	}
	opts.Filter.States = nil       // open records only
	filter := opts.Filter.String() // every event of the run names it
	if opts.Archive != nil {
		filter = strings.TrimSpace("archive=" + opts.Archive.Dir + " " + filter)
	}
	res := &ReplayResult{Run: newRun(), DryRun: opts.DryRun, Plan: []Planned{}, Sent: []string{}}
	start := time.Now()
	if opts.auto != nil {
		filter = autoFilter(opts.auto.queue)
	}
	selected, claimed, release, err := rp.selectLocked(ctx, opts.Filter, opts.Archive, opts.auto, opts.DryRun,
		Event{Run: res.Run, Reason: opts.Reason, Filter: filter, ToQueue: opts.ToQueue})
	if err != nil {
		return nil, err
	}
	defer release()
	// A run that claimed its quarantines and sends nothing still ends in
	// the audit trail, refused or finished, beside its claim.
	endClaimed := func(kind string, ids []string) {
		if len(claimed) == 0 {
			return
		}
		pub, err := amqpx.NewPublisher(rp.Conn)
		if err != nil {
			return
		}
		defer pub.Close()
		e := Event{Kind: kind, At: rp.now().UTC(), By: rp.by(), Run: res.Run, Reason: opts.Reason, Filter: filter, ToQueue: opts.ToQueue, IDs: ids,
			Counts: map[string]int{"selected": res.Selected, "sent": 0, "invalid": len(res.Invalid), "over_budget": len(res.OverBudget)}}
		if opts.auto != nil {
			e.Windows, e.Counts["windows"] = named(opts.auto.windows), len(opts.auto.windows)
		}
		for _, stream := range claimed {
			_ = publishEvent(context.WithoutCancel(ctx), pub, rp.Signer, stream, e)
		}
	}
	res.Selected = len(selected)
	gates := map[string]*schemas.Gate{}
	var send []*Record
	var msgs []amqp.Publishing
	var dests []string
	for _, r := range selected {
		if opts.Max > 0 && len(send) >= opts.Max {
			break
		}
		to := opts.ToQueue
		if to == "" {
			to = r.Queue
		}
		prior, verified := rp.priorRedrives(r)
		p := Planned{ID: r.ID, ToQueue: to, Redrives: prior + 1}
		qc, ok := rp.Config.QueueByName(r.Queue)
		if tq, isWork := rp.Config.QueueByName(to); isWork {
			qc, ok = tq, true
		}
		switch {
		case r.Envelope.PayloadOmitted != nil:
			p.Refused = fmt.Sprintf("its payload (%d bytes) was not kept: %s; nothing to replay", r.Envelope.PayloadOmitted.Bytes, r.Envelope.PayloadOmitted.Reason)
		case !ok:
			p.Refused = fmt.Sprintf("queue %q is not in the config", r.Queue)
		case prior >= qc.Quarantine.MaxRedrivesValue():
			p.Refused = fmt.Sprintf("over its redrive budget: replayed %d time(s), max_redrives is %d", prior, qc.Quarantine.MaxRedrivesValue())
			if !verified {
				p.Refused += "; the count (" + wire.HeaderRedriveCount + ") is not verified: this replay has no signing key (security.signing_key_env), and a producer can set it"
			}
			res.OverBudget = append(res.OverBudget, r.ID)
		}
		body, patch := r.Body, opts.Patch
		if p.Refused == "" && patch != nil {
			if patch, err = opts.Patch.forQueue(qc); err != nil {
				p.Refused = "patch: " + err.Error()
				res.Invalid = append(res.Invalid, r.ID)
			}
		}
		if p.Refused == "" && patch != nil {
			body, err = patch.Apply(body)
			if err != nil {
				p.Refused = "patch: " + err.Error()
				res.Invalid = append(res.Invalid, r.ID)
			}
		}
		if p.Refused == "" {
			verr := rp.check(ctx, gates, qc, r, body, patch)
			if errors.Is(verr, schemas.ErrStopped) {
				// Stopped (Ctrl-C, the page's client gone) while a
				// costly pattern ran: nothing was sent.
				endClaimed(EventReplayRefused, nil)
				return nil, verr
			}
			if verr != nil {
				p.Refused = "fails the current schema: " + verr.Error() + repairHint(qc, verr)
				res.Invalid = append(res.Invalid, r.ID)
			}
		}
		var msg amqp.Publishing
		if p.Refused == "" {
			msg = rp.message(r, body, prior, opts.Reason, to, patch, res.Run)
			if err := fitReplay(&msg, rp.frameMax()); err != nil {
				p.Refused = err.Error()
			}
		}
		res.Plan = append(res.Plan, p)
		if p.Refused == "" {
			send = append(send, r)
			msgs = append(msgs, msg)
			dests = append(dests, to)
		}
	}
	if len(res.Invalid) > 0 && !opts.SkipInvalid {
		endClaimed(EventReplayRefused, res.Invalid)
		return res, fmt.Errorf("%w: %s", ErrInvalid, strings.Join(res.Invalid, ", "))
	}
	if opts.DryRun || len(send) == 0 {
		endClaimed(EventReplayFinished, nil)
		res.Duration = Seconds(time.Since(start))
		return res, nil
	}

	pub, err := amqpx.NewPublisher(rp.Conn)
	if err != nil {
		return res, err
	}
	defer pub.Close()
	by := rp.by()
	start = time.Now() // Duration is the sending, not the reading
	var windows []OutageWindow
	if opts.auto != nil {
		windows = opts.auto.windows
	}
	event := func(intake string, e Event) error {
		e.At, e.By, e.Run, e.Reason = rp.now().UTC(), by, res.Run, opts.Reason
		if e.Kind != EventReplayed && windows != nil {
			if e.Counts == nil {
				e.Counts = map[string]int{}
			}
			e.Windows, e.Counts["windows"] = named(windows), len(windows)
		}
		return publishEvent(context.WithoutCancel(ctx), pub, rp.Signer, intakeEvents(rp.Config, intake), e)
	}
	// A cancel-requested event naming this run ends it (quarantine jobs
	// cancel), as the end of ctx does.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer rp.watchCancel(ctx, cancel, res.Run, claimed)()
	intakes := map[string][]string{}
	for _, r := range send {
		intakes[r.Intake] = append(intakes[r.Intake], r.ID)
	}
	for _, intake := range sortedKeys(intakes) {
		var patch string
		if opts.Patch != nil {
			patch = opts.Patch.String()
		}
		if err := event(intake, Event{Kind: EventReplayStarted, Filter: filter, IDs: intakes[intake], ToQueue: opts.ToQueue, Patch: patch,
			Counts: map[string]int{"selected": res.Selected, "to_send": len(intakes[intake]), "invalid": len(res.Invalid), "over_budget": len(res.OverBudget),
				"omitted": omitted(res.Plan)}}); err != nil {
			return res, fmt.Errorf("write audit event: %w", err)
		}
	}
	tracer := rp.TracerProvider
	if tracer == nil {
		tracer = otel.GetTracerProvider()
	}
	var limiter interface{ wait(context.Context) error } = newPacer(opts.Rate)
	if opts.ramp != nil {
		limiter = &rampPacer{ramp: *opts.ramp}
	}
	if opts.Started != nil {
		opts.Started(res)
	}
	var sendErr error
	published := 0
	for i, r := range send {
		if err := limiter.wait(ctx); err != nil {
			res.Stopped = true
			break
		}
		to, msg := dests[i], msgs[i]
		published++
		err := rp.publishTraced(ctx, tracer, pub, r, to, &msg)
		if err != nil {
			sendErr = fmt.Errorf("replay %s to %s: %w", r.ID, to, err)
			break
		}
		if err := event(r.Intake, Event{Kind: EventReplayed, IDs: []string{r.ID}, ToQueue: to}); err != nil {
			// Sent but not marked: a later replay may send it again (a
			// duplicate, never a loss).
			sendErr = fmt.Errorf("replayed %s but could not mark it: %w", r.ID, err)
			res.Sent = append(res.Sent, r.ID)
			break
		}
		res.Sent = append(res.Sent, r.ID)
		rp.Metrics.replayed(r.Queue, string(r.Envelope.Class))
		if opts.Progress != nil {
			el := time.Since(start).Seconds()
			rate := float64(len(res.Sent)) / max(el, 1e-9)
			opts.Progress(Progress{Done: len(res.Sent), Total: len(send), Rate: rate,
				ETA: time.Duration(float64(len(send)-len(res.Sent)) / rate * float64(time.Second))})
		}
		if ctx.Err() != nil && len(res.Sent) < len(send) {
			res.Stopped = true
			break
		}
	}
	res.Duration = Seconds(time.Since(start))
	var stop string
	switch {
	case sendErr != nil:
		// A send or its mark failed: the run did not do what it set out
		// to, and its finishing event must not say otherwise (an
		// automatic redrive's would cover its outages for good, with
		// their records open).
		res.Stopped = true
		stop = "failed: " + sendErr.Error()
	case res.Stopped:
		stop = "stopped: " + context.Cause(ctx).Error()
		if errors.Is(context.Cause(ctx), ErrCancelled) {
			stop = context.Cause(ctx).Error()
		}
	}
	res.Stop = stop
	for _, intake := range sortedKeys(intakes) {
		_ = event(intake, Event{Kind: EventReplayFinished, Filter: filter, ToQueue: opts.ToQueue, Stop: stop,
			Counts: map[string]int{"sent": len(res.Sent), "published": published, "selected": res.Selected, "stopped": boolInt(res.Stopped)}})
	}
	return res, sendErr
}

func (rp *Replayer) publishTraced(ctx context.Context, tp trace.TracerProvider, pub *amqpx.Publisher, r *Record, to string, msg *amqp.Publishing) error {
	prop := propagation.TraceContext{}
	orig := trace.SpanContextFromContext(prop.Extract(context.Background(), telemetry.HeaderCarrier(r.Headers())))
	var opts []trace.SpanStartOption
	if orig.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: orig}))
	}
	opts = append(opts, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		attribute.String("messaging.system", "rabbitmq"),
		attribute.String("messaging.destination.name", to),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.message.id", r.Properties.MessageID),
		attribute.String("dlxbridge.record.id", r.ID),
	))
	sctx, span := tp.Tracer("github.com/dlxbridge/dlxbridge/quarantine").Start(context.Background(), "replay "+to, opts...)
	defer span.End()
	prop.Inject(sctx, telemetry.HeaderCarrier(msg.Headers))
	err := pub.Publish(context.WithoutCancel(ctx), "", to, *msg)
	if err != nil {
		span.RecordError(err)
	}
	return err
}

func (rp *Replayer) check(ctx context.Context, gates map[string]*schemas.Gate, qc *config.Queue, r *Record, body []byte, patch *Patch) error {
	g, ok := gates[qc.Name]
	if !ok {
		var err error
		g, err = schemas.NewGate(qc.GateConfig(rp.Registry, rp.Config.Schemas.MaxBodyBytes))
		if err != nil {
			return err
		}
		gates[qc.Name] = g
	}
	typ, headers := r.Properties.Type, r.Headers()
	if patch != nil {
		typ, headers = patched(typ, headers, patch)
	}
	_, err := g.CheckContext(ctx, schemas.Input{ContentType: r.Properties.ContentType, ContentEncoding: r.Properties.ContentEncoding,
		Type: typ, Headers: headers, Body: body})
	return err
}

// patched is the type and a copy of the headers with p's set.
func patched(typ string, h amqp.Table, p *Patch) (string, amqp.Table) {
	out := make(amqp.Table, len(h)+len(p.Headers))
	for k, v := range h {
		out[k] = v
	}
	for k, v := range p.Headers {
		out[k] = v
	}
	if p.Type != "" {
		typ = p.Type
	}
	return typ, out
}

// repairHint names the replay option that repairs what the gate found in
// a message of qc: the identity (type, version) where the queue reads it
// from properties and headers, else the body.
func repairHint(qc *config.Queue, err error) string {
	var verr *schemas.ValidationError
	if !errors.As(err, &verr) {
		return ""
	}
	fromProps := qc.Message.From == "" || qc.Message.From == schemas.FromProperties
	switch verr.Reason {
	case schemas.ReasonMissingVersion, schemas.ReasonUnknownVersion, schemas.ReasonNotAccepted:
		if fromProps {
			return fmt.Sprintf(" (--set-version V, or --set-header %s=V, sets the version)", qc.Message.VersionHeader)
		}
		return " (the version is in the body: --patch FILE sets it)"
	case schemas.ReasonMissingType, schemas.ReasonUnknownType:
		if fromProps {
			return " (--set-type T sets the type property)"
		}
		return " (the type is in the body: --patch FILE sets it)"
	case schemas.ReasonInvalid, schemas.ReasonDecode:
		return " (--patch FILE or --replace-body FILE repairs the body)"
	}
	return ""
}

// Header names a replay keeps although they start with "dlxbridge-": what
// the bridge had to drop on the way and properties moved into headers. The
// exchange and routing key the message was first published with come from
// the record's envelope, never from its headers: a message the broker
// dead-lettered on its own keeps the producer's headers, and a replay with
// the consumers' key would sign whatever they said (the queue is where the
// replay sends it, so the runtime sets that anew).
var keptOnReplay = map[string]bool{
	wire.HeaderNotes: true, wire.HeaderDropped: true,
	wire.HeaderOriginalExpiration: true, wire.HeaderOriginalUserID: true,
}

// priorRedrives is how many times r's message was replayed before, and
// whether this replay verified it: with the consumers' key, the count its
// headers carry if a signature vouches for it (see trustedRedrives), read
// again from the record's headers and payload rather than its meta, else
// 0; without a key, the record's count as the keeper stored it
// (verified by a keeper that had the key, else as claimed).
func (rp *Replayer) priorRedrives(r *Record) (n int, verified bool) {
	if rp.Signer == nil {
		return r.Redrives, false
	}
	d := r.delivery()
	env, _ := ReadVerified(d, rp.Signer)
	n, _ = trustedRedrives(d, rp.Signer, env.Verified)
	return n, true
}

// delivery is r's message as it reached the intake.
func (r *Record) delivery() *amqp.Delivery {
	p := r.Properties
	return &amqp.Delivery{
		Headers: r.Headers(), Exchange: r.Exchange, RoutingKey: r.RoutingKey, Body: r.Body,
		ContentType: p.ContentType, ContentEncoding: p.ContentEncoding, DeliveryMode: p.DeliveryMode,
		Priority: p.Priority, CorrelationId: p.CorrelationID, ReplyTo: p.ReplyTo, Expiration: p.Expiration,
		MessageId: p.MessageID, Timestamp: p.Timestamp, Type: p.Type, UserId: p.UserID, AppId: p.AppID,
	}
}

// message builds the replayed message: the record's properties, payload
// and producer headers; its retry state reset (every dlxbridge envelope and
// attempt header, x-death, x-first-death-*, x-last-death-*,
// x-delivery-count and x-acquired-count stripped: a stale x-death can make
// a 3.x broker drop it and a stale count would trip the crash-loop guard);
// the redrive count,
// time and reason set. The idempotency key comes back from the envelope if
// the header was dropped to fit a frame.
func (rp *Replayer) message(r *Record, body []byte, prior int, reason, queue string, patch *Patch, run string) amqp.Publishing {
	d := r.delivery()
	h := frame.StripHeaders(d.Headers, func(k string) bool {
		// The record's expiration property, if it has one, is what the
		// copy's header says (see frame.Republish).
		return strings.HasPrefix(k, wire.OwnPrefix) && !keptOnReplay[k] ||
			k == wire.HeaderOriginalExpiration && d.Expiration != ""
	}, frame.CopyRoom)
	if _, ok := h[wire.HeaderIdempotencyKey]; !ok && r.Envelope.IdempotencyKey != "" && r.Envelope.IdempotencyKey != d.MessageId {
		h[wire.HeaderIdempotencyKey] = r.Envelope.IdempotencyKey
	}
	// The origin is signed only from an envelope whose signature verifies
	// with this key, read again from the record's headers and payload (not
	// from its meta, which anyone who may write the records stream
	// writes). Any other origin travels unsigned: the runtime then notes it
	// as a claim and records where the replay sent the message.
	e, signed := r.Envelope, false
	if rp.Signer != nil {
		if v, _ := ReadVerified(d, rp.Signer); v.Verified {
			e, signed = v, true
		}
	}
	if e.OriginalExchange != "" || e.OriginalRouting != "" {
		h[wire.HeaderOriginalExchange] = e.OriginalExchange
		h[wire.HeaderOriginalRoutingKey] = e.OriginalRouting
	}
	h[wire.HeaderRedriveCount] = int64(prior + 1)
	h[wire.HeaderRedriveAt] = rp.now().UTC().Format(time.RFC3339Nano)
	h[wire.HeaderRedriveReason] = frame.Truncate(reason, maxErrorBytes)
	if patch != nil {
		for k, v := range patch.Headers {
			h[k] = v
		}
	}
	p := frame.Republish(d, h, body)
	if patch != nil && patch.Type != "" {
		p.Type = patch.Type
	}
	// The count is signed whatever the record's origin: a broker dead
	// letter of a crash-looping message (never an envelope the runtime
	// signed) must still have its replays counted, which is what
	// max_redrives is for.
	h[wire.HeaderRedriveSignature] = rp.Signer.SignRedrive(p.MessageId, body, h)
	if h[wire.HeaderRedriveSignature] == "" {
		delete(h, wire.HeaderRedriveSignature)
	}
	// The job and record it was sent from: evidence for the runtime, which
	// records what became of the message in the job only under this
	// signature.
	h[wire.HeaderReplayJob], h[wire.HeaderReplayRecord] = run, r.ID
	if sig := rp.Signer.SignReplayJob(queue, p.MessageId, body, h); sig != "" {
		h[wire.HeaderReplayJobSignature] = sig
	}
	if signed {
		h[wire.HeaderSignature] = rp.Signer.Sign(triage.Subject{Queue: queue, MessageID: p.MessageId, Body: body}, h, triage.SignedHeaders())
	}
	return p
}

// replayTraceRoom is what publishTraced adds to a message after fitReplay:
// a traceparent header (72 bytes encoded), with room to spare.
const replayTraceRoom = 256

// refusedFrame starts the refusal of a message fitReplay cannot fit.
const refusedFrame = "its headers do not fit one frame"

// frameMax is the frame size rp's connection negotiated.
func (rp *Replayer) frameMax() int {
	if rp.Conn != nil && rp.Conn.Config.FrameSize > 0 {
		return rp.Conn.Config.FrameSize
	}
	return frame.DefaultFrameSize
}

// fitReplay makes msg's content header fit frameMax: a larger header frame
// makes the broker close the whole connection (FRAME_ERROR), which for an
// automatic redrive is the runtime's publishing connection, again at each
// try. The replay adds its headers to a record that may fill most of a
// frame already (the runtime fits what it quarantines), so its reason, the
// one of them that may be long and that no signature covers, is cut
// first; a message still too large is refused, never sent.
func fitReplay(msg *amqp.Publishing, frameMax int) error {
	over := frame.HeaderFrameSize(msg) + replayTraceRoom - frameMax
	if reason, ok := msg.Headers[wire.HeaderRedriveReason].(string); ok && over > 0 {
		msg.Headers[wire.HeaderRedriveReason] = frame.Truncate(reason, max(len(reason)-over, 0))
		over = frame.HeaderFrameSize(msg) + replayTraceRoom - frameMax
	}
	if over > 0 {
		return fmt.Errorf("%s (%d bytes over the connection's frame_max of %d, which would make the broker close the connection): export it and trim its headers", refusedFrame, over, frameMax)
	}
	return nil
}

// selectLocked takes the lock of the quarantines f can touch (unless this
// is a dry run), claims them (see claim) and only then reads the records f
// selects, so what another replay or purge resolved meanwhile is no longer
// selected.
// It also returns the events streams it claimed.
func (rp *Replayer) selectLocked(ctx context.Context, f Filter, archive *Archive, auto *autoSelect, dryRun bool, claim Event) ([]*Record, []string, func(), error) {
	// The live records only say what is resolved for an archive; an
	// automatic redrive, inside the runtime, reads the payloads of those it
	// picks, not of the whole quarantine.
	in := &Inspector{Conn: rp.Conn, Config: rp.Config, Now: rp.Now, Verifier: rp.Signer, eventWaits: rp.eventWaits,
		OmitBodies: archive != nil || auto != nil}
	release := func() {}
	var marks map[string]string
	if !dryRun {
		locked := lockedSets(in.quarantines(), f.Queue)
		var err error
		if release, err = rp.lock(ctx, locked); err != nil {
			return nil, nil, nil, err
		}
		if marks, err = rp.claim(ctx, locked, claim); err != nil {
			release()
			return nil, nil, nil, err
		}
	}
	snap, err := in.snapshot(ctx, marks)
	if err != nil {
		release()
		return nil, nil, nil, err
	}
	if rp.selected != nil {
		rp.selected(snap)
	}
	if archive != nil {
		recs, err := fromArchive(snap, archive, f)
		if err != nil {
			release()
			return nil, nil, nil, err
		}
		return recs, slices.Sorted(maps.Keys(marks)), release, nil
	}
	if auto != nil {
		picked := auto.pick(snap)
		gone, err := in.readBodies(ctx, picked)
		if err != nil {
			release()
			return nil, nil, nil, err
		}
		// A payload that retention removed meanwhile is not sent: its
		// record stays as it is.
		picked = slices.DeleteFunc(picked, func(r *Record) bool { return slices.Contains(gone, r) })
		return picked, slices.Sorted(maps.Keys(marks)), release, nil
	}
	// An id prefix names one record: one that several share would send or
	// resolve all of them.
	for _, id := range f.IDs {
		if _, err := snap.Get(id); errors.Is(err, ErrAmbiguous) {
			release()
			return nil, nil, nil, err
		}
	}
	return snap.List(f), slices.Sorted(maps.Keys(marks)), release, nil
}

// fromArchive selects the records of a that f matches and that no event
// of the live quarantine (read under the lock) marks replayed or purged:
// an archive replayed twice sends each message once. A record the archive
// says was resolved, or that is still in the stream and resolved there,
// is not open; one that retention removed, or that the archive calls
// expired, is open unless an event says otherwise.
func fromArchive(snap *Snapshot, a *Archive, f Filter) ([]*Record, error) {
	resolved := map[string]bool{}
	for _, e := range snap.Events {
		if !e.Ignored && (e.Kind == EventReplayed || e.Kind == EventPurged) {
			for _, id := range e.IDs {
				resolved[id] = true
			}
		}
	}
	for _, id := range f.IDs {
		n := 0
		for _, r := range a.Records {
			if r.ID == id || len(id) >= 4 && strings.HasPrefix(r.ID, id) {
				n++
			}
		}
		if n > 1 {
			return nil, fmt.Errorf("%w: %q", ErrAmbiguous, id)
		}
	}
	var out []*Record
	for _, r := range a.Records {
		if resolved[r.ID] || r.State == StateReplayed || r.State == StatePurged {
			continue
		}
		r.State = StateOpen
		if f.Match(r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// claim writes a claimed event (the run's, under its lock) into the events
// stream of each quarantine in sets and waits for the broker's confirms.
// Every event written before the lock was taken precedes it, so reading
// each stream up to it reads them all, without waiting to find an end: a
// record replayed by an earlier run never looks open to this one, however
// slow the broker. It returns, by events stream, the run to read up to.
func (rp *Replayer) claim(ctx context.Context, sets []*quarantineSet, e Event) (map[string]string, error) {
	if len(sets) == 0 {
		return nil, nil
	}
	pub, err := amqpx.NewPublisher(rp.Conn)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	e.Kind, e.At, e.By = EventClaimed, rp.now().UTC(), rp.by()
	marks := map[string]string{}
	for _, s := range sets {
		stream := s.cfg.Quarantine.EventsStream()
		if err := publishEvent(ctx, pub, rp.Signer, stream, e); err != nil {
			return nil, fmt.Errorf("claim %s: %w", stream, err)
		}
		marks[stream] = e.Run
	}
	return marks, nil
}

// lockedSets are the quarantines a filter on queue (a work queue or an
// intake; "" for any) can touch.
func lockedSets(sets []*quarantineSet, queue string) []*quarantineSet {
	var out []*quarantineSet
	for _, s := range sets {
		match := queue == "" || s.cfg.Quarantine.Queue == queue
		for _, q := range s.queues {
			match = match || q.Name == queue
		}
		if match {
			out = append(out, s)
		}
	}
	return out
}

// lock takes the replay lock of each of sets, in name order: an exclusive
// queue "<intake>.replay-lock". The broker allows one connection to hold it
// and deletes it when that connection closes, so a replay that is killed
// releases it.
func (rp *Replayer) lock(ctx context.Context, sets []*quarantineSet) (release func(), err error) {
	var names []string
	for _, s := range sets {
		names = append(names, s.cfg.Quarantine.Queue+".replay-lock")
	}
	sort.Strings(names)
	type lockHeld struct {
		ch   *amqp.Channel
		name string
	}
	var held []lockHeld
	// An exclusive queue belongs to the connection, not the channel:
	// delete it to release the lock while the connection lives on.
	release = func() {
		for _, l := range held {
			_, _ = l.ch.QueueDelete(l.name, false, false, false)
			_ = l.ch.Close()
		}
	}
	deadline := time.Now().Add(rp.LockWait)
	for _, name := range names {
		for {
			ch, err := rp.Conn.Channel()
			if err != nil {
				release()
				return nil, err
			}
			const durable, autoDelete, exclusive, noWait = false, true, true, false
			_, err = ch.QueueDeclare(name, durable, autoDelete, exclusive, noWait, nil)
			if err == nil {
				held = append(held, lockHeld{ch, name})
				break
			}
			var ae *amqp.Error
			if !errors.As(err, &ae) || ae.Code != amqp.ResourceLocked {
				release()
				return nil, fmt.Errorf("lock %s: %w", name, err)
			}
			if time.Now().After(deadline) {
				release()
				return nil, fmt.Errorf("%w (lock %s)", ErrLocked, name)
			}
			select {
			case <-ctx.Done():
				release()
				return nil, ctx.Err()
			case <-time.After(200 * time.Millisecond): // the broker has no lock-released event
			}
		}
	}
	return release, nil
}

func intakeEvents(cfg *config.Config, intake string) string {
	for i := range cfg.Queues {
		if cfg.Queues[i].Quarantine.Queue == intake {
			return cfg.Queues[i].Quarantine.EventsStream()
		}
	}
	return intake + config.EventsSuffix
}

func sortedKeys(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// omitted counts the plan's records refused for a payload not kept, or
// for headers that do not fit one frame (see fitReplay).
func omitted(plan []Planned) int {
	n := 0
	for _, p := range plan {
		if strings.HasPrefix(p.Refused, "its payload") || strings.HasPrefix(p.Refused, refusedFrame) {
			n++
		}
	}
	return n
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// pacer is a token bucket refilled at rate per second, holding at most one
// second of tokens and starting empty: the n-th message leaves no earlier
// than start + n/rate.
type pacer struct {
	interval time.Duration
	next     time.Time
}

// MinRate is the slowest replay rate: one message an hour.
const MinRate = 1.0 / 3600

func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	return &pacer{interval: time.Duration(float64(time.Second) / rate)}
}

func (p *pacer) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.interval == 0 {
		return nil
	}
	// The bucket holds at most one second of tokens and starts empty: a
	// slow publish is made up for, but never with more than rate messages
	// at once.
	now := time.Now()
	if p.next.IsZero() {
		p.next = now
	}
	if floor := now.Add(-time.Second); p.next.Before(floor) {
		p.next = floor
	}
	if d := p.next.Sub(now); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	p.next = p.next.Add(p.interval)
	return nil
}
