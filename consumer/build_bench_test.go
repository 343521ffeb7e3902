package consumer

import (
	"bytes"
	"errors"
	"testing"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// BenchmarkBuild is the client's CPU per failure event in a storm: the
// publishing a retry or a quarantine sends (headers, signature, envelope,
// fingerprint, fitting), for a 1 KB body. Its allocs/op are what to watch.
func BenchmarkBuild(b *testing.B) {
	sb := newSettleBundle(b, frame.DefaultFrameSize)
	d := delivery()
	d.Body = bytes.Repeat([]byte("x"), 1024)
	schemaInvalid := quarantineFailure()
	schemaInvalid.err = nil
	schemaInvalid.verdict.Class = triage.ClassSchema
	schemaInvalid.validation = &schemas.ValidationError{Reason: schemas.ReasonInvalid,
		Violations: []schemas.Violation{{Pointer: "/lineItems/0/quantity", Keyword: "minimum", Message: "must be >= 1 but found 0"}}}
	cases := []struct {
		name string
		f    failure
	}{
		{"retry", retryFailure()},
		{"quarantine", quarantineFailure()},
		{"quarantine-schema", schemaInvalid},
	}
	cases[1].f.err = errors.New("bench: this message always fails")
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := build(sb.input(d, c.f)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
