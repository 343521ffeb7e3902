package quarantine

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/wire"
)

// Patch repairs messages before a replay: their body (an RFC 7386 JSON
// merge patch applied to each payload, or a replacement body), their
// headers, their type, or both. The result must pass the current schema
// before it is sent; the record stays open until the patched message is
// confirmed. The commonest producer bug, a missing or wrong schema-version
// header, is a header repair.
type Patch struct {
	// Merge is a JSON merge patch.
	Merge json.RawMessage
	// Replace is a whole new body (used when Merge is empty).
	Replace []byte
	// Headers are set on each message, replacing a header of the same
	// name. The broker's own (x-…), the routing ones (CC, BCC) and the
	// bridge's (dlxbridge-…) are refused (see Check).
	Headers map[string]string
	// Type, when not "", replaces the AMQP type property.
	Type string
	// Version, when not "", sets the schema version header of each
	// message's own queue (its message.version_header): queues may name
	// different headers, so it is resolved per record. A queue that reads
	// the version from the body refuses it (--patch repairs that).
	Version string
}

// forQueue is p as it applies to a message of qc: Version becomes a header
// under qc's version header name.
func (p *Patch) forQueue(qc *config.Queue) (*Patch, error) {
	if p == nil || p.Version == "" {
		return p, nil
	}
	if qc.Message.From != "" && qc.Message.From != schemas.FromProperties {
		return nil, fmt.Errorf("queue %s reads the version from the body (message.from: %s): --patch FILE sets it there", qc.Name, qc.Message.From)
	}
	name := qc.Message.VersionHeader
	if _, both := p.Headers[name]; both {
		return nil, fmt.Errorf("the version and a header %s both set the version", name)
	}
	q := *p
	q.Headers = make(map[string]string, len(p.Headers)+1)
	for k, v := range p.Headers {
		q.Headers[k] = v
	}
	q.Headers[name] = p.Version
	q.Version = ""
	return &q, nil
}

// Check reports what makes p unusable: a header the broker or the bridge
// owns, a name or value no AMQP header should carry.
func (p *Patch) Check() error {
	for k, v := range p.Headers {
		switch {
		case strings.TrimSpace(k) == "" || k != strings.TrimSpace(k):
			return fmt.Errorf("header name %q is empty or has surrounding spaces", k)
		case strings.HasPrefix(strings.ToLower(k), "x-"):
			return fmt.Errorf("header %q belongs to the broker (x-…)", k)
		case wire.IsRoutingHeader(strings.ToUpper(k)):
			// On the default exchange a replay publishes to, CC and BCC
			// route copies to the queues they name (any case is refused:
			// no repair needs one).
			return fmt.Errorf("header %q routes copies to other queues (CC, BCC)", k)
		case strings.HasPrefix(strings.ToLower(k), wire.OwnPrefix):
			return fmt.Errorf("header %q belongs to the bridge (%s…): it is signed, and a replay sets what it must", k, wire.OwnPrefix)
		case len(k) > 255 || len(v) > 4096:
			return fmt.Errorf("header %q: name over 255 or value over 4096 bytes", k)
		case hasControl(k) || hasControl(v):
			return fmt.Errorf("header %q: control characters in its name or value", k)
		}
	}
	if hasControl(p.Version) || len(p.Version) > 255 {
		return fmt.Errorf("version %q: control characters or over 255 bytes", p.Version)
	}
	if hasControl(p.Type) || len(p.Type) > 255 {
		return fmt.Errorf("type %q: control characters or over 255 bytes", p.Type)
	}
	return nil
}

// hasControl reports C0, DEL and C1 (U+0080–U+009F, which an 8-bit
// terminal acts on) control characters.
func hasControl(s string) bool {
	return strings.ContainsFunc(s, unicode.IsControl)
}

// body reports whether p changes the body.
func (p *Patch) body() bool { return len(p.Merge) > 0 || p.Replace != nil }

// String describes p for the audit trail: which headers and type it sets
// (with their values) and whether it changes the body.
func (p *Patch) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(p.Headers)) {
		parts = append(parts, fmt.Sprintf("set-header %s=%s", k, p.Headers[k]))
	}
	if p.Type != "" {
		parts = append(parts, "type="+p.Type)
	}
	if p.Version != "" {
		parts = append(parts, "version="+p.Version)
	}
	switch {
	case len(p.Merge) > 0:
		parts = append(parts, "merge patch")
	case p.Replace != nil:
		parts = append(parts, "body replaced")
	}
	return strings.Join(parts, "; ")
}

// Apply returns the patched body (the body itself if p changes only
// headers or the type).
func (p *Patch) Apply(body []byte) ([]byte, error) {
	if !p.body() {
		return body, nil
	}
	if len(p.Merge) == 0 {
		return append([]byte(nil), p.Replace...), nil
	}
	var doc, patch any
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("payload is not JSON: %w", err)
	}
	if err := json.Unmarshal(p.Merge, &patch); err != nil {
		return nil, fmt.Errorf("merge patch is not JSON: %w", err)
	}
	out, err := json.Marshal(mergePatch(doc, patch))
	if err != nil {
		return nil, errors.New("patched payload cannot be encoded")
	}
	return out, nil
}

// mergePatch is RFC 7386: objects merge key by key, null deletes, anything
// else replaces.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
			continue
		}
		t[k] = mergePatch(t[k], v)
	}
	return t
}
