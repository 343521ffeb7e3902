package schemas

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// Gate defaults.
const (
	DefaultMaxBodyBytes  = 1 << 20
	DefaultMaxViolations = 20
)

// GateConfig configures a Gate.
type GateConfig struct {
	// Registry holds the schemas. Required.
	Registry *Registry
	// Identity says where a message names its type and version. Defaults to
	// the AMQP type property plus the "schema-version" header.
	Identity Identity
	// Accepts maps each accepted type to its accepted versions ("v2" and
	// "2" both work); every one must exist in Registry. Defaults to every
	// type and version in Registry (as a publisher wants).
	Accepts map[string][]string
	// MaxBodyBytes is the largest body decoded; a larger one fails with
	// ReasonTooLarge before any parsing. Defaults to 1 MiB; -1 means no
	// limit.
	MaxBodyBytes int
	// MaxViolations caps ValidationError.Violations. Defaults to 20.
	MaxViolations int
}

// Gate checks messages before any handler sees them: size, content type,
// identity, one decode, schema validation. It is immutable and safe for
// concurrent use.
type Gate struct {
	reg           *Registry
	id            Identity
	accepts       map[string]map[string]bool
	maxBody       int
	maxViolations int
	// routes holds each accepted type and version (as accepts does) with
	// its schema and fast path: one lookup for what known, Lookup and
	// the fast path's map found for every message.
	routes map[routeKey]route
	// noStream turns the tree-free path off, and fullValidate the invalid
	// path (for tests that compare).
	noStream, fullValidate bool
}

// NewGate validates cfg and returns a Gate.
func NewGate(cfg GateConfig) (*Gate, error) {
	if cfg.Registry == nil {
		return nil, errors.New("schemas: GateConfig.Registry is required")
	}
	id, err := cfg.Identity.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("schemas: GateConfig.%w", err)
	}
	g := &Gate{reg: cfg.Registry, id: id, accepts: map[string]map[string]bool{}, maxBody: cfg.MaxBodyBytes, maxViolations: cfg.MaxViolations}
	switch {
	case g.maxBody == 0:
		g.maxBody = DefaultMaxBodyBytes
	case g.maxBody < -1:
		return nil, fmt.Errorf("schemas: GateConfig.MaxBodyBytes must be positive or -1, not %d", g.maxBody)
	}
	switch {
	case g.maxViolations == 0:
		g.maxViolations = DefaultMaxViolations
	case g.maxViolations < 0:
		return nil, fmt.Errorf("schemas: GateConfig.MaxViolations must be positive, not %d", g.maxViolations)
	}
	if cfg.Accepts == nil {
		for _, ref := range cfg.Registry.refs {
			g.accept(ref.Type, ref.Version)
		}
		return g, nil
	}
	var missing []string
	for typ, versions := range cfg.Accepts {
		if len(versions) == 0 {
			missing = append(missing, typ+" (no versions)")
		}
		for _, v := range versions {
			v = NormalizeVersion(v)
			if _, ok := cfg.Registry.Lookup(typ, v); !ok {
				missing = append(missing, typ+" v"+v)
				continue
			}
			g.accept(typ, v)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("schemas: GateConfig.Accepts names schemas not in the registry: %s", strings.Join(missing, ", "))
	}
	return g, nil
}

func (g *Gate) accept(typ, version string) {
	if g.accepts[typ] == nil {
		g.accepts[typ] = map[string]bool{}
	}
	g.accepts[typ][version] = true
	if g.routes == nil {
		g.routes = map[routeKey]route{}
	}
	schema, _ := g.reg.Lookup(typ, version)
	g.routes[routeKey{typ, version}] = route{schema, g.reg.fast[schema]}
}

type routeKey struct{ typ, version string }

type route struct {
	schema *jsonschema.Schema
	fast   *fastSchema // nil: no fast path
}

// resolve is known, and on nil the schema of typ and version and its fast
// path. An accepted type and version is one lookup in routes; anything
// else, which known refuses, takes known for its error.
func (g *Gate) resolve(typ, version string) (route, *ValidationError) {
	if r, ok := g.routes[routeKey{typ, version}]; ok {
		return r, nil
	}
	if verr := g.known(typ, version); verr != nil {
		return route{}, verr
	}
	schema, _ := g.reg.Lookup(typ, version)
	return route{schema, g.reg.fast[schema]}, nil
}

// Input is what the gate sees of a delivery.
type Input struct {
	ContentType     string
	ContentEncoding string
	// Type is the AMQP type property.
	Type string
	// Headers are the AMQP headers (values as amqp091-go decodes them).
	Headers map[string]any
	Body    []byte
}

// Message is a message that passed the gate.
type Message struct {
	Type    string
	Version string
	// Raw is the JSON text the gate validated: Input.Body, or for
	// FromEnvelope the text of its "data" member (a subslice of
	// Input.Body). Decoding it with json.Unmarshal into a struct is one
	// pass. On a message the gate passes, it validates Raw without
	// decoding it into a tree: Data does that, when asked.
	Raw []byte

	// data is the value of Raw, once decoded (hasData).
	data    any
	hasData bool
}

// Data returns the validated value, decoded from Raw as encoding/json does
// with UseNumber (map[string]any, []any, string, json.Number, bool, nil).
// The first call decodes Raw (unless the gate had decoded it already) and
// later calls return the same value; like the rest of a Message, it is not
// safe for concurrent use. For FromEnvelope it is the envelope's "data"
// member. Its strings and numbers share one copy of Raw. It returns nil
// when Raw is nil (CheckReport on a body that is not JSON), and an error
// only when Raw is not JSON, which the gate never returns.
func (m *Message) Data() (any, error) {
	if m.hasData || m.Raw == nil {
		return m.data, nil
	}
	v, derr := decodeJSON(m.Raw)
	if derr != nil {
		return nil, fmt.Errorf("schemas: Message.Raw: %w", derr)
	}
	m.data, m.hasData = v, true
	return v, nil
}

// Check runs the gate. It returns the decoded, validated message, or a
// *ValidationError and no message; it never panics on any input.
func (g *Gate) Check(in Input) (*Message, error) {
	return g.CheckContext(context.Background(), in)
}

// CheckContext is Check bounded by ctx (a message's deadline). A costly
// pattern match (a large pattern on a long string) runs once per value
// and looks at ctx every fraction of a millisecond; when ctx ends first,
// the check stops and returns an error wrapping ErrStopped and ctx's error,
// not a *ValidationError: the message was not found invalid, so its caller
// settles it as it would a timeout. With a context that never ends it is
// Check.
//
// One thing is not stopped: a schema without a fast path (see the package
// doc) is validated by jsonschema, whose pattern matches nothing can
// interrupt; when one may be costly it runs on a goroutine of its own, the
// check returns at ctx's end, and that validation finishes in the
// background.
func (g *Gate) CheckContext(ctx context.Context, in Input) (*Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStopped, err)
	}
	d := getTokDoc()
	defer d.release()
	d.run.start(ctx)
	m, verr := g.check(d, in)
	if err := d.run.err; err != nil {
		return nil, err // whatever the check said after it stopped is void
	}
	if verr != nil {
		// Type and version may come from the message itself: keep a
		// hostile one from bloating logs, headers and envelopes.
		verr.Type, verr.Version = capLen(verr.Type), capLen(verr.Version)
		return nil, verr
	}
	return m, nil
}

// check runs the gate with d, a tokDoc for the body's tokens that also
// carries the check's pattern work (d.run).
func (g *Gate) check(d *tokDoc, in Input) (*Message, *ValidationError) {
	if g.maxBody >= 0 && len(in.Body) > g.maxBody {
		return nil, &ValidationError{Reason: ReasonTooLarge, Detail: fmt.Sprintf("body is %d bytes, the limit is %d", len(in.Body), g.maxBody)}
	}
	if err := checkContentType(in.ContentType); err != nil {
		return nil, err
	}
	if enc := strings.TrimSpace(in.ContentEncoding); enc != "" && !strings.EqualFold(enc, "identity") {
		return nil, &ValidationError{Reason: ReasonEncoding, Detail: fmt.Sprintf("content-encoding %q is not supported (only identity)", capLen(enc))}
	}

	var typ, version string
	var rt route // the route of typ and version with FromProperties
	if g.id.From == FromProperties {
		var verr *ValidationError
		if typ, version, verr = g.fromProperties(in); verr != nil {
			return nil, verr
		}
		if rt, verr = g.resolve(typ, version); verr != nil {
			return nil, verr
		}
	}

	m, verr, invalidFor, overBudget := g.checkStream(d, in.Body, typ, version, rt)
	if m != nil || verr != nil || d.run.err != nil {
		return m, verr
	}

	doc, raw, derr := g.decode(in.Body)
	if derr != nil {
		verr := &ValidationError{Type: typ, Version: version, Reason: ReasonDecode, Detail: capLen(derr.Error())}
		if derr.rpath != nil {
			verr.Violations = []Violation{{Pointer: derr.pointer(), Keyword: "json", Message: derr.Msg}}
		}
		return nil, verr
	}

	data, prefix := doc, ""
	switch g.id.From {
	case FromEnvelope:
		var verr *ValidationError
		if typ, version, data, verr = fromEnvelope(doc); verr != nil {
			return nil, verr
		}
		prefix = "/data"
	case FromPointer:
		var verr *ValidationError
		if typ, version, verr = g.fromPointer(doc); verr != nil {
			return nil, verr
		}
	}
	if g.id.From != FromProperties {
		if verr := g.known(typ, version); verr != nil {
			return nil, verr
		}
	}

	schema, _ := g.reg.Lookup(typ, version)
	// The stream path's fast path already found the same data invalid
	// for this schema: no need to ask the tree's.
	if invalidFor != schema && g.reg.fastValid(&d.run, schema, data) {
		return &Message{Type: typ, Version: version, Raw: raw, data: data, hasData: true}, nil
	}
	if len(in.Body) >= preflightMinBody {
		if pv := preflight(schema, data, 0); pv != nil {
			return nil, &ValidationError{Type: typ, Version: version, Reason: ReasonInvalid, Violations: []Violation{pv.violation(prefix)}}
		}
	}
	if verr := g.validate(&d.run, schema, data, prefix, overBudget); verr != nil {
		verr.Type, verr.Version = typ, version
		return nil, verr
	}
	return &Message{Type: typ, Version: version, Raw: raw, data: data, hasData: true}, nil
}

// validate lists what is wrong with data, a value the decoder made, which
// the fast path finds invalid (or which has none): through the invalid
// path (see vnode), unless the gate is told to take the full validation,
// its oracle in tests.
// overBudget: the invalid path already gave up on the body's tokens.
func (g *Gate) validate(r *run, schema *jsonschema.Schema, data any, prefix string, overBudget bool) *ValidationError {
	if g.fullValidate {
		return validate(schema, data, prefix, g.maxViolations)
	}
	return g.reg.violationsAfter(r, schema, data, prefix, g.maxViolations, overBudget)
}

// checkStream runs the gate's tree-free path (see stream.go) on a body that
// passed the size, content type and encoding checks; typ and version are
// set for FromProperties, with their route rt. It returns a message the gate passes, or with
// FromProperties the error of one it refuses (through the invalid path, on
// the tokens), or neither: the tree path then decides, and gives the error.
// invalidFor is the schema whose fast path found the body's data (the
// body, or an envelope's "data" member) invalid, if it got that far;
// overBudget says the invalid path on the tokens gave up for too many
// failing values (the tree path then validates in full at once).
func (g *Gate) checkStream(d *tokDoc, body []byte, typ, version string, rt route) (m *Message, verr *ValidationError, invalidFor *jsonschema.Schema, overBudget bool) {
	if g.noStream {
		return nil, nil, nil, false
	}
	defer func() {
		// A panic here is a bug, but the tree path still gives the
		// right verdict.
		if recover() != nil {
			m, verr, invalidFor, overBudget = nil, nil, nil, false
		}
	}()
	if !d.tokenize(body) {
		return nil, nil, nil, false
	}
	data, raw, ok := int32(0), body, false
	switch g.id.From {
	case FromEnvelope:
		if typ, version, data, ok = d.envelope(); !ok {
			return nil, nil, nil, false
		}
		raw = d.text(data)
	case FromPointer:
		if typ, version, ok = d.identity(g.id.TypePointer, g.id.VersionPointer); !ok {
			return nil, nil, nil, false
		}
	}
	if g.id.From != FromProperties {
		var verr *ValidationError
		if rt, verr = g.resolve(typ, version); verr != nil {
			return nil, nil, nil, false
		}
	}
	schema, f := rt.schema, rt.fast
	if f == nil {
		return nil, nil, nil, false
	}
	if f.validTok(d, data) {
		return &Message{Type: typ, Version: version, Raw: raw}, nil, nil, false
	}
	// With FromProperties the tree path would decode the body (which
	// tokenized, so it decodes), skip preflight for a small one, and
	// validate the whole body against this same schema: the invalid path
	// on the tokens gives that error without the tree.
	if n := g.reg.inv[schema]; n != nil && g.id.From == FromProperties && !g.fullValidate && len(body) < preflightMinBody {
		leaves, err := leavesOf(n, tokVals{d}, data, maxInvalidCalls)
		if err == nil && len(leaves) > 0 {
			vs, truncated := leafViolations(leaves, "", g.maxViolations)
			return nil, &ValidationError{Type: typ, Version: version, Reason: ReasonInvalid, Violations: vs, Truncated: truncated}, schema, false
		}
		return nil, nil, schema, errors.Is(err, errOverBudget)
	}
	return nil, nil, schema, false
}

// decode decodes the body: the document, and the text of what the gate
// validates (the body, or an envelope's "data" member, nil if none).
func (g *Gate) decode(body []byte) (doc any, text []byte, derr *decodeError) {
	if g.id.From == FromEnvelope {
		return decodeJSONMember(body, "data")
	}
	doc, derr = decodeJSON(body)
	return doc, body, derr
}

// fastValid reports whether the fast path of schema, if it has one, finds
// data valid. False says nothing: jsonschema decides. A panic in the fast
// path is a bug, but jsonschema still gives the right verdict.
func (r *Registry) fastValid(run *run, schema *jsonschema.Schema, data any) (ok bool) {
	f := r.fast[schema]
	if f == nil {
		return false
	}
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return f.valid(run, data)
}

// checkContentType accepts "", application/json and application/*+json,
// with no charset or charset=utf-8.
func checkContentType(ct string) *ValidationError {
	if ct == "application/json" || strings.TrimSpace(ct) == "" {
		return nil // the first: what nearly every message says
	}
	bad := func(why string) *ValidationError {
		return &ValidationError{Reason: ReasonContentType, Detail: fmt.Sprintf("content type %q %s", capLen(ct), why)}
	}
	base, params, hasParams := strings.Cut(ct, ";")
	base = strings.ToLower(strings.TrimSpace(base))
	if base != "application/json" && !(strings.HasPrefix(base, "application/") && strings.HasSuffix(base, "+json")) {
		return bad("is not JSON (want application/json or application/*+json)")
	}
	if hasParams {
		_, ps, err := mime.ParseMediaType(base + ";" + params)
		if err != nil {
			return bad("has malformed parameters")
		}
		if cs, ok := ps["charset"]; ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
			return bad("is not UTF-8")
		}
	}
	return nil
}

// known classifies a type and version against the registry and Accepts.
func (g *Gate) known(typ, version string) *ValidationError {
	if !g.reg.HasType(typ) {
		return &ValidationError{Type: typ, Version: version, Reason: ReasonUnknownType, Detail: fmt.Sprintf("type %q is not in the schema registry", capLen(typ))}
	}
	if _, ok := g.reg.Lookup(typ, version); !ok {
		return &ValidationError{Type: typ, Version: version, Reason: ReasonUnknownVersion, Detail: fmt.Sprintf("version %q of %s is not in the schema registry", capLen(version), typ)}
	}
	if !g.accepts[typ][version] {
		return &ValidationError{Type: typ, Version: version, Reason: ReasonNotAccepted, Detail: fmt.Sprintf("%s v%s is not accepted here", typ, version)}
	}
	return nil
}

func (g *Gate) fromProperties(in Input) (typ, version string, verr *ValidationError) {
	typ = strings.TrimSpace(in.Type)
	if typ == "" {
		return "", "", &ValidationError{Reason: ReasonMissingType, Detail: "the AMQP type property is empty"}
	}
	raw, ok := in.Headers[g.id.VersionHeader]
	if !ok {
		return typ, "", &ValidationError{Type: typ, Reason: ReasonMissingVersion, Detail: fmt.Sprintf("no %q header", g.id.VersionHeader)}
	}
	if version, ok = versionString(raw); !ok {
		return typ, "", &ValidationError{Type: typ, Reason: ReasonMissingVersion, Detail: fmt.Sprintf("header %q is not a version (%T)", g.id.VersionHeader, raw)}
	}
	return typ, version, nil
}

func (g *Gate) fromPointer(doc any) (typ, version string, verr *ValidationError) {
	t, ok := lookupPointer(doc, g.id.TypePointer)
	if typ, _ = t.(string); !ok || strings.TrimSpace(typ) == "" {
		return "", "", &ValidationError{Reason: ReasonMissingType, Detail: fmt.Sprintf("no type string at %s", g.id.TypePointer)}
	}
	v, ok := lookupPointer(doc, g.id.VersionPointer)
	if !ok {
		return typ, "", &ValidationError{Type: typ, Reason: ReasonMissingVersion, Detail: fmt.Sprintf("no version at %s", g.id.VersionPointer)}
	}
	if version, ok = versionString(v); !ok {
		return typ, "", &ValidationError{Type: typ, Reason: ReasonMissingVersion, Detail: fmt.Sprintf("value at %s is not a version", g.id.VersionPointer)}
	}
	return typ, version, nil
}

// fromEnvelope reads {"type", "schemaVersion" | "dataschema", "data"}.
// schemaVersion and dataschema, when both present, must agree.
func fromEnvelope(doc any) (typ, version string, data any, verr *ValidationError) {
	env, ok := doc.(map[string]any)
	if !ok {
		return "", "", nil, &ValidationError{Reason: ReasonMissingType, Detail: "body is not an envelope object"}
	}
	if typ, _ = env["type"].(string); strings.TrimSpace(typ) == "" {
		return "", "", nil, &ValidationError{Reason: ReasonMissingType, Detail: `envelope has no "type" string`}
	}
	sv, hasSV := env["schemaVersion"]
	ds, hasDS := env["dataschema"]
	if hasSV {
		if version, ok = versionString(sv); !ok {
			return typ, "", nil, &ValidationError{Type: typ, Reason: ReasonMissingVersion, Detail: `envelope "schemaVersion" is not a version`}
		}
	}
	if hasDS {
		s, _ := ds.(string)
		dv, ok := versionFromDataschema(s)
		if !ok {
			return typ, version, nil, &ValidationError{Type: typ, Version: version, Reason: ReasonMissingVersion, Detail: `envelope "dataschema" does not end in /v<N>.json`}
		}
		if hasSV && dv != version {
			return typ, version, nil, &ValidationError{Type: typ, Version: version, Reason: ReasonUnknownVersion, Detail: fmt.Sprintf(`envelope "schemaVersion" %s and "dataschema" v%s disagree`, version, dv)}
		}
		version = dv
	}
	if !hasSV && !hasDS {
		return typ, "", nil, &ValidationError{Type: typ, Reason: ReasonMissingVersion, Detail: `envelope has neither "schemaVersion" nor "dataschema"`}
	}
	if data, ok = env["data"]; !ok {
		return typ, version, nil, &ValidationError{Type: typ, Version: version, Reason: ReasonInvalid,
			Violations: []Violation{{Pointer: "", Keyword: "required", Message: `missing property "data"`}}}
	}
	return typ, version, data, nil
}

// Validate checks data, a value as the gate decodes it (see Message.Data),
// against the schema of typ's version, as the gate does after decoding: the
// consumer checks what upcasters produce with it. It returns nil or a
// *ValidationError: ReasonInvalid with at most DefaultMaxViolations
// violations, or ReasonUnknownType or ReasonUnknownVersion.
func (r *Registry) Validate(typ, version string, data any) error {
	schema, ok := r.Lookup(typ, version)
	if !ok {
		reason := ReasonUnknownVersion
		if !r.HasType(typ) {
			reason = ReasonUnknownType
		}
		return &ValidationError{Type: typ, Version: version, Reason: reason, Detail: "no schema for " + capLen(typ) + " v" + capLen(version)}
	}
	// An upcaster may build values the decoder never makes (int, float64,
	// a struct); only jsonschema knows what it makes of them.
	var verr *ValidationError
	var run run // a costly pattern runs once per value
	switch {
	case !decoded(data):
		verr = validate(schema, data, "", DefaultMaxViolations)
	case r.fastValid(&run, schema, data):
		return nil
	default:
		verr = r.violationsAfter(&run, schema, data, "", DefaultMaxViolations, false)
	}
	if verr != nil {
		verr.Type, verr.Version = typ, NormalizeVersion(version)
		return verr
	}
	return nil
}

// validate runs the schema. A panic inside the validator is a bug, but the
// message that triggers it is exactly a poison pill: it is classified rather
// than allowed to crash the consumer.
func validate(schema *jsonschema.Schema, data any, prefix string, maxViolations int) (verr *ValidationError) {
	defer func() {
		if r := recover(); r != nil {
			verr = &ValidationError{Reason: ReasonInvalid, Detail: capLen(fmt.Sprintf("validator panicked: %v", r))}
		}
	}()
	err := schema.Validate(data)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if errors.As(err, &ve) {
		vs, truncated := flatten(ve, prefix, maxViolations)
		return &ValidationError{Reason: ReasonInvalid, Violations: vs, Truncated: truncated}
	}
	return &ValidationError{Reason: ReasonInvalid, Detail: capLen(err.Error())}
}
