package triage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Class is the kind of a failure. It decides whether a message is retried.
type Class string

const (
	// ClassTransient is a failure that may pass on a later attempt; the
	// default for plain errors.
	ClassTransient Class = "transient"
	// ClassPermanent is a failure the handler declared final with Permanent.
	ClassPermanent Class = "permanent"
	// ClassSchema is a message that failed validation; never retried.
	ClassSchema Class = "schema"
	// ClassTimeout is a handler that exceeded its deadline; retried like
	// transient.
	ClassTimeout Class = "timeout"
	// ClassPanic is a recovered handler panic; retried like transient.
	ClassPanic Class = "panic"
	// ClassCrashLoop is a message the broker dead-lettered with
	// delivery_limit, or whose x-delivery-count is over budget; never
	// retried.
	ClassCrashLoop Class = "crash-loop"
	// ClassExpired is a message the broker dead-lettered for its TTL.
	ClassExpired Class = "expired"
	// ClassMaxLen is a message the broker dead-lettered for a length limit.
	ClassMaxLen Class = "maxlen"
	// ClassRejected is a message the broker dead-lettered after a reject
	// without requeue.
	ClassRejected Class = "rejected"
)

// classes are the classes triage and the broker's dead-letter reasons give,
// in the order they are declared.
var classes = []Class{
	ClassTransient, ClassPermanent, ClassSchema, ClassTimeout, ClassPanic,
	ClassCrashLoop, ClassExpired, ClassMaxLen, ClassRejected,
}

// Classes returns every class a failure can have, in declaration order
// (transient first). Metrics label by it, so a class added here gets a
// series of its own. The returned slice is a copy.
func Classes() []Class { return slices.Clone(classes) }

// Retryable reports whether a failure of class c is retried: transient,
// timeout and panic are; every other class, unknown ones included, is not.
func (c Class) Retryable() bool {
	switch c {
	case ClassTransient, ClassTimeout, ClassPanic:
		return true
	}
	return false
}

// Permanent marks err as final: the message is quarantined after this
// delivery. Permanent(nil) is a non-nil error.
func Permanent(err error) error {
	return &permanentError{err: orDefault(err, "permanent failure")}
}

// RetryAfter marks err as transient with a delay hint (e.g. an HTTP
// Retry-After): the retry waits at least d, rounded up to a tier (see
// Decide). d <= 0 is no hint. RetryAfter(d, nil) is a non-nil error.
func RetryAfter(d time.Duration, err error) error {
	return &retryAfterError{err: orDefault(err, "retry after "+d.String()), after: d}
}

// Schema marks err as a schema failure: the message is quarantined and
// never retried. Any error with a SchemaFailure() bool method returning true
// counts too: the schema gate's *schemas.ValidationError has one, so the
// runtime classifies the gate's refusals here like every other failure,
// without triage knowing the schemas package. Schema(nil) is a non-nil error.
func Schema(err error) error {
	return &schemaError{err: orDefault(err, "schema failure")}
}

// PanicError is a recovered handler panic.
type PanicError struct {
	Value any
	Stack []byte
}

// Error includes the panic value (not the stack).
func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// Unwrap returns the panic value if it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

type schemaError struct{ err error }

func (e *schemaError) Error() string       { return e.err.Error() }
func (e *schemaError) Unwrap() error       { return e.err }
func (e *schemaError) SchemaFailure() bool { return true }

// schemaFailure is implemented by errors that are schema failures (an
// error, so that errors.AsType takes it).
type schemaFailure interface {
	error
	SchemaFailure() bool
}

func orDefault(err error, msg string) error {
	if err == nil {
		return errors.New(msg)
	}
	return err
}

// Classify returns the class of a handler error and its delay hint (from
// RetryAfter, else 0). A nil error is not a failure: Classify returns ("", 0).
//
// Markers are found anywhere in the wrap chain (errors.As / errors.Is), and
// the most conservative wins, in this order:
//
//	*PanicError                        → ClassPanic
//	Schema, or SchemaFailure() == true → ClassSchema
//	Permanent                          → ClassPermanent
//	context.DeadlineExceeded           → ClassTimeout (with the RetryAfter hint, if any)
//	RetryAfter or DependencyDown       → ClassTransient with the hint
//	anything else                      → ClassTransient
//
// context.Canceled is transient: whether a cancelled handler (shutdown) is
// retried or requeued is the runtime's call, not the error's.
func Classify(err error) (Class, time.Duration) {
	if err == nil {
		return "", 0
	}
	// errors.AsType, not errors.As: a target of errors.As escapes, an
	// allocation per marker looked for on every failed delivery.
	var hint time.Duration
	if ra, ok := errors.AsType[*retryAfterError](err); ok && ra.after > 0 {
		hint = ra.after
	}
	if _, ok := errors.AsType[*PanicError](err); ok {
		return ClassPanic, hint
	}
	if sf, ok := errors.AsType[schemaFailure](err); ok && sf.SchemaFailure() {
		return ClassSchema, 0
	}
	if _, ok := errors.AsType[*permanentError](err); ok {
		return ClassPermanent, 0
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ClassTimeout, hint
	}
	return ClassTransient, hint
}

// ClassifyDeadLetter labels a message the broker dead-lettered itself (as
// found in a quarantine): delivery_limit → ClassCrashLoop, expired →
// ClassExpired, maxlen → ClassMaxLen, rejected → ClassRejected. The reason
// is the newest x-death entry's (the broker puts the latest dead-lettering
// first), else x-last-death-reason (3.13+), else x-first-death-reason. ok is
// false when none of them holds a known reason.
func ClassifyDeadLetter(h History, headers map[string]any) (Class, bool) {
	var reasons []string
	if len(h.Deaths) > 0 {
		reasons = append(reasons, h.Deaths[0].Reason)
	}
	for _, name := range []string{wire.HeaderLastDeathReason, wire.HeaderFirstDeathReason} {
		if s, ok := wireval.String(headers[name]); ok {
			reasons = append(reasons, s)
		}
	}
	for _, r := range reasons {
		if c, ok := deadLetterClass(r); ok {
			return c, true
		}
	}
	return "", false
}

func deadLetterClass(reason string) (Class, bool) {
	switch reason {
	case ReasonDeliveryLimit:
		return ClassCrashLoop, true
	case ReasonExpired:
		return ClassExpired, true
	case ReasonMaxLen:
		return ClassMaxLen, true
	case ReasonRejected:
		return ClassRejected, true
	}
	return "", false
}
