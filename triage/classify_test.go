package triage

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/wire"
)

// validationError stands in for the schema gate's error type, which marks
// itself with a SchemaFailure method.
type validationError struct{ field string }

func (e *validationError) Error() string       { return "invalid " + e.field }
func (e *validationError) SchemaFailure() bool { return true }

type notSchema struct{}

func (notSchema) Error() string       { return "looks like schema" }
func (notSchema) SchemaFailure() bool { return false }

func TestClassify(t *testing.T) {
	t.Parallel()

	wrap := func(err error) error { return fmt.Errorf("handler orders.created: %w", err) }
	tests := []struct {
		name  string
		err   error
		class Class
		hint  time.Duration
	}{
		{"nil is not a failure", nil, "", 0},
		{"plain error", io.ErrUnexpectedEOF, ClassTransient, 0},
		{"context canceled", context.Canceled, ClassTransient, 0},
		{"permanent", Permanent(io.EOF), ClassPermanent, 0},
		{"permanent wrapped twice", wrap(wrap(Permanent(io.EOF))), ClassPermanent, 0},
		{"permanent(nil)", Permanent(nil), ClassPermanent, 0},
		{"retry after", RetryAfter(3*time.Second, io.EOF), ClassTransient, 3 * time.Second},
		{"retry after wrapped", wrap(RetryAfter(time.Minute, nil)), ClassTransient, time.Minute},
		{"retry after zero is no hint", RetryAfter(0, io.EOF), ClassTransient, 0},
		{"retry after negative is no hint", RetryAfter(-time.Second, io.EOF), ClassTransient, 0},
		{"deadline", context.DeadlineExceeded, ClassTimeout, 0},
		{"deadline wrapped", wrap(fmt.Errorf("call billing: %w", context.DeadlineExceeded)), ClassTimeout, 0},
		{"deadline with hint", RetryAfter(2*time.Second, context.DeadlineExceeded), ClassTimeout, 2 * time.Second},
		{"panic", &PanicError{Value: "boom"}, ClassPanic, 0},
		{"panic wrapped", wrap(&PanicError{Value: io.EOF}), ClassPanic, 0},
		{"schema marker", Schema(io.EOF), ClassSchema, 0},
		{"schema(nil)", Schema(nil), ClassSchema, 0},
		{"schema via interface", wrap(&validationError{field: "/id"}), ClassSchema, 0},
		{"SchemaFailure() false is not schema", notSchema{}, ClassTransient, 0},
		{"schema beats retry-after", RetryAfter(time.Second, Schema(io.EOF)), ClassSchema, 0},
		{"permanent beats deadline", Permanent(context.DeadlineExceeded), ClassPermanent, 0},
		{"permanent inside retry-after still permanent", RetryAfter(time.Second, Permanent(io.EOF)), ClassPermanent, 0},
		{"schema beats permanent", Permanent(Schema(io.EOF)), ClassSchema, 0},
		{"joined: permanent wins", errors.Join(io.EOF, Permanent(io.EOF)), ClassPermanent, 0},
	}
	for _, tt := range tests {
		class, hint := Classify(tt.err)
		if class != tt.class || hint != tt.hint {
			t.Errorf("%s: Classify = %q, %s; want %q, %s", tt.name, class, hint, tt.class, tt.hint)
		}
	}
}

func TestMarkersKeepTheError(t *testing.T) {
	t.Parallel()

	for _, err := range []error{Permanent(io.EOF), RetryAfter(time.Second, io.EOF), Schema(io.EOF), &PanicError{Value: io.EOF}} {
		if !errors.Is(err, io.EOF) {
			t.Errorf("%T does not unwrap to its cause", err)
		}
	}
	if got := Permanent(io.EOF).Error(); got != "EOF" {
		t.Errorf("Permanent(EOF).Error() = %q", got)
	}
	if got := RetryAfter(time.Second, nil).Error(); got != "retry after 1s" {
		t.Errorf("RetryAfter(1s, nil).Error() = %q", got)
	}
	pe := &PanicError{Value: 42, Stack: []byte("goroutine 1")}
	if got := pe.Error(); got != "panic: 42" {
		t.Errorf("PanicError.Error() = %q", got)
	}
	if pe.Unwrap() != nil {
		t.Error("a non-error panic value unwrapped to an error")
	}
}

func TestRetryable(t *testing.T) {
	t.Parallel()

	retryable := map[Class]bool{
		ClassTransient: true, ClassTimeout: true, ClassPanic: true,
		ClassPermanent: false, ClassSchema: false, ClassCrashLoop: false,
		ClassExpired: false, ClassMaxLen: false, ClassRejected: false, "": false, "other": false,
	}
	for c, want := range retryable {
		if c.Retryable() != want {
			t.Errorf("%q.Retryable() = %v", c, !want)
		}
	}
}

func TestClassifyDeadLetter(t *testing.T) {
	t.Parallel()

	death := func(q, reason string) table { return table{"queue": q, "reason": reason, "count": int64(1)} }
	tests := []struct {
		name    string
		headers table
		class   Class
		ok      bool
	}{
		{"crash loop after retries: newest entry wins over the first death", table{
			"x-death":                   []any{death(workQueue, "delivery_limit"), death(laneQueue(time.Second, 0), "expired")},
			wire.HeaderFirstDeathReason: "expired",
		}, ClassCrashLoop, true},
		{"queue TTL", table{"x-death": []any{death(workQueue, "expired")}}, ClassExpired, true},
		{"max length", table{"x-death": []any{death(workQueue, "maxlen")}}, ClassMaxLen, true},
		{"rejected", table{"x-death": []any{death(workQueue, "rejected")}}, ClassRejected, true},
		{"no x-death: last-death header (3.13+)", table{wire.HeaderLastDeathReason: "maxlen", wire.HeaderFirstDeathReason: "expired"}, ClassMaxLen, true},
		{"no x-death: first-death header", table{wire.HeaderFirstDeathReason: []byte("delivery_limit")}, ClassCrashLoop, true},
		{"unknown reason falls through", table{"x-death": []any{death(workQueue, "weird")}, wire.HeaderFirstDeathReason: "expired"}, ClassExpired, true},
		{"nothing", nil, "", false},
		{"garbage", table{"x-death": "x", wire.HeaderFirstDeathReason: 7}, "", false},
	}
	for _, tt := range tests {
		class, ok := ClassifyDeadLetter(HistoryOf(tt.headers), tt.headers)
		if class != tt.class || ok != tt.ok {
			t.Errorf("%s: = %q, %v; want %q, %v", tt.name, class, ok, tt.class, tt.ok)
		}
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()

	a := Fingerprint(ClassTransient, `order 123e4567-e89b-12d3-a456-426614174000 (id 981) failed: dial tcp 10.0.0.12:5672: i/o timeout after 1.5s, key "k-1"`, "orders.created", "2")
	b := Fingerprint(ClassTransient, `Order 9b2e4567-aaaa-42d3-b456-000014174999 (id 7) failed:  dial tcp 10.9.8.7:15672: i/o timeout after 30s, key "other"`, "orders.created", "2")
	if a != b {
		t.Errorf("same failure with different ids: %s != %s", a, b)
	}
	if len(a) != 16 || strings.Trim(a, "0123456789abcdef") != "" {
		t.Errorf("fingerprint %q is not 16 hex digits", a)
	}
	for name, other := range map[string]string{
		"class":   Fingerprint(ClassPermanent, "x", "orders.created", "2"),
		"message": Fingerprint(ClassTransient, "connection refused", "orders.created", "2"),
		"type":    Fingerprint(ClassTransient, "x", "orders.cancelled", "2"),
		"version": Fingerprint(ClassTransient, "x", "orders.created", "1"),
	} {
		if other == Fingerprint(ClassTransient, "x", "orders.created", "2") {
			t.Errorf("a different %s gave the same fingerprint", name)
		}
	}
	// Field boundaries are not ambiguous.
	if Fingerprint("a", "b", "", "") == Fingerprint("a", "", "b", "") {
		t.Error("message and type run together")
	}
}

func TestNormalizeMessage(t *testing.T) {
	t.Parallel()

	tests := []struct{ in, want string }{
		{"", ""},
		{"  Connection   REFUSED\n\t", "connection refused"},
		{"order 123e4567-E89B-12d3-a456-426614174000 missing", "order <uuid> missing"},
		{"dial tcp 10.0.0.12:5672: refused", "dial tcp <ip>: refused"},
		{"dial tcp [::1]:5672: refused", "dial tcp <ip>: refused"},
		{"timed out after 2m30s (limit 1.5s, 250ms)", "timed out after <dur> (limit <dur>, <dur>)"},
		{"object deadbeef01 at 0x7ffe12", "object <hex> at <hex>"},
		{"row 42 of 1234567890123", "row <n> of <n>"},
		{"price 3.14 ok", "price <n> ok"},
		{`user "bob \"the\" builder" and 'alice' and ` + "`sql`", "user <str> and <str> and <str>"},
		{"can't parse it", "can't parse it"},
		{"sha256 mismatch", "sha<n> mismatch"},
	}
	for _, tt := range tests {
		if got := NormalizeMessage(tt.in); got != tt.want {
			t.Errorf("NormalizeMessage(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	long := NormalizeMessage(strings.Repeat("é word ", 10_000))
	if len(long) > maxNormalizedLen {
		t.Errorf("normalized to %d bytes", len(long))
	}
}

// A storm fingerprints the same few error texts thousands of times:
// NormalizeMessage remembers them (no regular expression runs again), within
// a bound, and gives what it would have computed.
func TestNormalizeMessageRemembersWithinABound(t *testing.T) {
	const text = `order 8812 failed: dial tcp 10.0.0.1:5672: refused after 1.5s`
	want := normalize(text)
	if got := NormalizeMessage(text); got != want {
		t.Fatalf("NormalizeMessage = %q, want %q", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { NormalizeMessage(text) }); n != 0 {
		t.Errorf("a repeated text costs %v allocations, want 0 (remembered)", n)
	}
	for i := range 3 * normalizedCap {
		s := fmt.Sprintf("order %d failed: %x", i, i)
		if got, want := NormalizeMessage(s), normalize(s); got != want {
			t.Fatalf("NormalizeMessage(%q) = %q, want %q", s, got, want)
		}
	}
	normalized.mu.Lock()
	n := len(normalized.m)
	normalized.mu.Unlock()
	if n > normalizedCap {
		t.Errorf("%d texts remembered, want at most %d", n, normalizedCap)
	}
	long := strings.Repeat("x", 3*maxNormalizeInput)
	if got, want := NormalizeMessage(long), normalize(long[:maxNormalizeInput]); got != want {
		t.Errorf("a long text: %q, want %q", got, want)
	}
}

// Classes lists every Class constant the package declares, so that a class
// added later reaches what labels by the list (the quarantine metrics).
func TestClassesListsEveryClassConstant(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared []Class
	for _, f := range pkgs["triage"].Files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Class" {
					continue
				}
				for i := range vs.Names {
					lit := vs.Values[i].(*ast.BasicLit)
					v, _ := strconv.Unquote(lit.Value)
					declared = append(declared, Class(v))
				}
			}
		}
	}
	got := Classes()
	slices.Sort(got)
	slices.Sort(declared)
	if len(declared) == 0 || !slices.Equal(got, declared) {
		t.Errorf("Classes() = %v, the package declares %v", got, declared)
	}
}
