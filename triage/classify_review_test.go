package triage

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// classifyAs is Classify as it was with errors.As, the reference for
// errors.AsType's.
func classifyAs(err error) (Class, time.Duration) {
	if err == nil {
		return "", 0
	}
	var hint time.Duration
	if ra := (*retryAfterError)(nil); errors.As(err, &ra) && ra.after > 0 {
		hint = ra.after
	}
	var pe *PanicError
	if errors.As(err, &pe) {
		return ClassPanic, hint
	}
	var sf interface{ SchemaFailure() bool }
	if errors.As(err, &sf) && sf.SchemaFailure() {
		return ClassSchema, 0
	}
	var perm *permanentError
	if errors.As(err, &perm) {
		return ClassPermanent, 0
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ClassTimeout, hint
	}
	return ClassTransient, hint
}

// notSchemaWrap says it is no schema failure; a marker deeper in the chain
// must not count.
type notSchemaWrap struct{ err error }

func (e notSchemaWrap) Error() string       { return "not schema" }
func (e notSchemaWrap) Unwrap() error       { return e.err }
func (e notSchemaWrap) SchemaFailure() bool { return false }

// asPanic answers errors.As for a *PanicError target with its own, and
// for any other target not at all.
type asPanic struct{}

func (asPanic) Error() string { return "as panic" }
func (asPanic) As(target any) bool {
	if p, ok := target.(**PanicError); ok {
		*p = &PanicError{Value: "from As"}
		return true
	}
	return false
}

// asSchemaMarker answers errors.As for an error target with a schema
// marker: no marker's target is one.
type asSchemaMarker struct{}

func (asSchemaMarker) Error() string { return "as schema" }
func (asSchemaMarker) As(target any) bool {
	if p, ok := target.(*error); ok {
		*p = Schema(nil)
		return true
	}
	return false
}

type nilUnwrap struct{}

func (nilUnwrap) Error() string { return "nil unwrap" }
func (nilUnwrap) Unwrap() error { return nil }

type joinWithNil struct{}

func (joinWithNil) Error() string   { return "join with nil" }
func (joinWithNil) Unwrap() []error { return []error{nil, Permanent(nil), nil} }

// TestClassifyAsTypeAgrees: Classify and IsDependencyDown with
// errors.AsType give what errors.As gave, for wrapped, joined, nil-inside
// and custom-As errors.
func TestClassifyAsTypeAgrees(t *testing.T) {
	t.Parallel()
	var typedNilPanic *PanicError
	cases := map[string]error{
		"nil":                     nil,
		"plain":                   errors.New("x"),
		"permanent wrapped":       fmt.Errorf("a: %w", Permanent(nil)),
		"schema in join":          errors.Join(errors.New("a"), Schema(nil)),
		"panic after permanent":   errors.Join(Permanent(nil), &PanicError{Value: 1}),
		"typed nil panic":         typedNilPanic,
		"typed nil panic wrapped": fmt.Errorf("w: %w", typedNilPanic),
		"custom As panic":         fmt.Errorf("w: %w", asPanic{}),
		"custom As error target":  asSchemaMarker{},
		"not schema then schema":  notSchemaWrap{Schema(nil)},
		"schema then not schema":  Schema(notSchemaWrap{nil}),
		"two %w":                  fmt.Errorf("%w and %w", RetryAfter(3*time.Second, nil), context.DeadlineExceeded),
		"retry after 0":           RetryAfter(0, nil),
		"retry after negative":    RetryAfter(-time.Second, context.DeadlineExceeded),
		"dependency down":         DependencyDown(7*time.Second, nil),
		"dependency down joined":  errors.Join(nil, DependencyDown(-1, Permanent(nil))),
		"nil unwrap":              nilUnwrap{},
		"join with nil":           joinWithNil{},
		"deep":                    fmt.Errorf("1: %w", fmt.Errorf("2: %w", errors.Join(fmt.Errorf("3: %w", RetryAfter(time.Minute, nil)), Schema(nil)))),
		"joined deadline":         errors.Join(context.Canceled, context.DeadlineExceeded),
	}
	for name, err := range cases {
		// A typed nil *PanicError panics in its Unwrap, with either.
		r1 := try(func() string { c, h := Classify(err); return fmt.Sprint(c, h) })
		r2 := try(func() string { c, h := classifyAs(err); return fmt.Sprint(c, h) })
		if r1 != r2 {
			t.Errorf("%s: Classify = %s, with errors.As %s", name, r1, r2)
		}
		r1 = try(func() string { d, ok := IsDependencyDown(err); return fmt.Sprint(d, ok) })
		r2 = try(func() string {
			var dd *dependencyDownError
			if !errors.As(err, &dd) {
				return fmt.Sprint(time.Duration(0), false)
			}
			return fmt.Sprint(max(dd.err.after, 0), true)
		})
		if r1 != r2 {
			t.Errorf("%s: IsDependencyDown = %s, with errors.As %s", name, r1, r2)
		}
	}
}

// try is f's result, or "panic".
func try(f func() string) (s string) {
	defer func() {
		if recover() != nil {
			s = "panic"
		}
	}()
	return f()
}
