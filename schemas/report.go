package schemas

import (
	"context"
	"strings"

	"github.com/dlxbridge/dlxbridge/wire"
)

// SchemaFailure reports true: a message that fails the gate can never become
// valid by retrying it. triage.Classify recognises the method (without
// importing this package) and classes such an error, wrapped or not, as
// triage.ClassSchema.
func (e *ValidationError) SchemaFailure() bool { return true }

// CheckReport runs the gate like Check, for a caller that hands refused
// messages on anyway (a consumer whose gate is in report mode). On success it
// returns what Check returns. On failure it returns the same
// *ValidationError and also a Message with what the gate could read: Type
// and Version as far as it got (either may be ""), and Data and Raw when the
// body decodes as JSON (for FromEnvelope the envelope's "data" member, if
// any).
// Data is nil when the body is over the size limit, encoded, or not
// acceptable JSON. It never panics.
func (g *Gate) CheckReport(in Input) (*Message, error) {
	return g.CheckReportContext(context.Background(), in)
}

// CheckReportContext is CheckReport bounded by ctx as CheckContext is:
// when ctx ends first it returns no message and CheckContext's error
// (ErrStopped), which is no *ValidationError.
func (g *Gate) CheckReportContext(ctx context.Context, in Input) (*Message, error) {
	m, err := g.CheckContext(ctx, in)
	if err == nil {
		return m, nil
	}
	verr, ok := err.(*ValidationError)
	if !ok {
		return nil, err // stopped
	}
	m = &Message{Type: verr.Type, Version: verr.Version}
	switch verr.Reason {
	case ReasonTooLarge, ReasonEncoding, ReasonDecode:
		return m, verr
	}
	doc, text, derr := g.decode(in.Body)
	if derr != nil {
		return m, verr
	}
	m.Raw, m.data, m.hasData = text, doc, true
	if g.id.From == FromEnvelope {
		env, _ := doc.(map[string]any)
		m.data = env["data"]
	}
	return m, verr
}

// ReadProperties returns the type and version a message names in its
// properties: the AMQP type property and the versionHeader header
// (normalized as NormalizeVersion does; "" selects wire.DefaultVersionHeader).
// Either is "" when absent or unreadable, and both are capped like a
// ValidationError's. It reads no body and never fails: it is for callers
// that run no gate.
func ReadProperties(in Input, versionHeader string) (typ, version string) {
	if versionHeader == "" {
		versionHeader = wire.DefaultVersionHeader
	}
	version, _ = versionString(in.Headers[versionHeader])
	return capLen(strings.TrimSpace(in.Type)), capLen(version)
}
