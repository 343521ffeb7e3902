package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/schemas"
)

// The schema gate runs in one of three modes per queue (config.Queue.Gate):
//
//   - enforce: a message that fails the gate is quarantined (class schema)
//     and never reaches a handler;
//   - report: every message is checked and every failure counted and logged
//     (sampled), and the message goes to its handler anyway, with
//     Message.GateError set;
//   - off: no gate. Type and Version come from the AMQP type property and
//     the version header when present, the body is not read, and Bind
//     decodes it.

// admitted is what the gate lets through to the router.
type admitted struct {
	schemas.Message
	// raw is set when the gate is off: the body was not read.
	raw bool
	// reported is the gate's objection in report mode.
	reported *schemas.ValidationError
}

// refresh drops whatever tree the gate decoded, for another handler call
// on the same delivery: a handler may change the maps and slices Data
// handed it, and the next call's Data decodes Raw afresh (as the gate
// decodes: encoding/json with UseNumber). A message with no text (a
// report-mode gate's objection to a body that is not JSON) has no tree.
func (a *admitted) refresh() {
	if a.Raw == nil {
		return
	}
	a.Message = schemas.Message{Type: a.Type, Version: a.Version, Raw: a.Raw}
}

// newGate builds q's schema gate; with the gate off there is none (nil).
func newGate(reg *schemas.Registry, q *config.Queue, maxBody int) (*schemas.Gate, error) {
	if q.Gate == config.GateOff {
		return nil, nil
	}
	gate, err := schemas.NewGate(q.GateConfig(reg, maxBody))
	if err != nil {
		return nil, fmt.Errorf("queue %q: schema gate: %w", q.Name, err)
	}
	return gate, nil
}

// gated reports whether any queue of f runs the gate, and so needs a
// registry.
func gated(f *config.Config) bool {
	if f == nil {
		return true
	}
	for _, q := range f.Queues {
		if q.Gate != config.GateOff {
			return true
		}
	}
	return false
}

// admit runs d through the queue's gate in the queue's mode, bounded by
// ctx (see gateCtx). It returns the message for the router, or (enforce
// mode only) the gate's *schemas.ValidationError. Every failure is
// counted, by mode. In either mode, a check that ctx stopped (a costly
// pattern on a long string, past the handler timeout) returns an error
// wrapping context.DeadlineExceeded (or the session's cancellation): the
// message was not found invalid, and settles as a handler that timed out
// would.
func (qr *queueRuntime) admit(ctx context.Context, d *amqp.Delivery) (admitted, error) {
	in := schemas.Input{
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		Type:            d.Type,
		Headers:         d.Headers,
		Body:            d.Body,
	}
	switch qr.cfg.Gate {
	case config.GateOff:
		typ, version := schemas.ReadProperties(in, qr.cfg.Message.VersionHeader)
		return admitted{Message: schemas.Message{Type: typ, Version: version}, raw: true}, nil
	case config.GateReport:
		msg, err := qr.gate.CheckReportContext(ctx, in)
		if errors.Is(err, schemas.ErrStopped) {
			return admitted{}, qr.gateStopped(err)
		}
		a := admitted{Message: *msg}
		var verr *schemas.ValidationError
		if errors.As(err, &verr) {
			a.reported = verr
			qr.countViolation(verr)
			qr.logReported(d, verr)
		}
		return a, nil
	}
	msg, err := qr.gate.CheckContext(ctx, in)
	if err != nil {
		var verr *schemas.ValidationError
		if errors.As(err, &verr) {
			qr.countViolation(verr)
		}
		if errors.Is(err, schemas.ErrStopped) {
			err = qr.gateStopped(err)
		}
		return admitted{}, err
	}
	return admitted{Message: *msg}, nil
}

// gateStopped says what stopped the gate.
func (qr *queueRuntime) gateStopped(err error) error {
	return fmt.Errorf("schema gate: the check did not finish within the handler timeout (%s): %w", qr.cfg.Consumer.HandlerTimeout, err)
}

// gateCtx bounds one delivery's gate check: it has the deadline, the
// delivery's handler context's values and its cancellation (the drain
// deadline), and no timer of its own. Its Done closes only with the
// session's; the gate also compares the time with Deadline as it goes
// (schemas.Gate.CheckContext), so no timer per message is needed. A worker
// keeps one and sets it for each delivery: only the gate, which keeps
// nothing of it, is given it.
type gateCtx struct {
	context.Context
	deadline time.Time
}

func (c *gateCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *gateCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

func (qr *queueRuntime) countViolation(verr *schemas.ValidationError) {
	qr.deps.metrics.validation.WithLabelValues(qr.cfg.Name, qr.typeLabel(verr.Type), qr.versionLabel(verr.Type, verr.Version), string(verr.Reason), qr.cfg.Gate).Inc()
}

// logReported logs a report-mode failure, sampled: a flood of bad messages
// must not flood the logs (the metric counts every one).
func (qr *queueRuntime) logReported(d *amqp.Delivery, verr *schemas.ValidationError) {
	ok, suppressed := qr.reportLog.allow(qr.deps.cfg.Now())
	if !ok {
		return
	}
	qr.deps.log.Warn("schema gate (report mode): the message fails the gate; delivering it anyway",
		"queue", qr.cfg.Name, "message_id", d.MessageId, "type", verr.Type, "version", verr.Version,
		"reason", string(verr.Reason), "error", verr.Error(), "suppressed_since_last", suppressed)
}

// Report-mode logging: at most reportLogBurst lines per reportLogWindow and
// queue.
const (
	reportLogBurst  = 10
	reportLogWindow = 10 * time.Second
)

// logSampler lets reportLogBurst events through per reportLogWindow and
// counts the rest, which the next event that gets through reports. Safe for
// concurrent use.
type logSampler struct {
	mu         sync.Mutex
	start      time.Time
	passed     int
	suppressed int
}

func (s *logSampler) allow(now time.Time) (ok bool, suppressed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.start) >= reportLogWindow || now.Before(s.start) {
		s.start, s.passed = now, 0
	}
	if s.passed >= reportLogBurst {
		s.suppressed++
		return false, 0
	}
	s.passed++
	suppressed, s.suppressed = s.suppressed, 0
	return true, suppressed
}

// takes reports whether handlers for msgType (and version; "" for every
// version) may be registered on q: msgType "" is the queue's default
// handler; with the gate off any type may be handled; otherwise the type
// (and version) must be in q's accepts.
func takes(q *config.Queue, msgType, version string) bool {
	if msgType == "" || q.Gate == config.GateOff {
		return true
	}
	for _, a := range q.Accepts {
		if a.Type != msgType {
			continue
		}
		if version == "" {
			return true
		}
		for _, v := range a.Versions {
			if v == version {
				return true
			}
		}
	}
	return false
}
func (qr *queueRuntime) typeLabel(t string) string {
	if _, ok := qr.accepts[t]; ok {
		return t
	}
	return "other"
}

func (qr *queueRuntime) versionLabel(t, v string) string {
	if qr.accepts[t][v] {
		return v
	}
	return "other"
}
