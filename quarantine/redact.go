package quarantine

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Redacted replaces every redacted value.
const Redacted = "[redacted]"

// Redaction says what to scrub before a message is quarantined.
type Redaction struct {
	// Headers are header names (case-insensitive) whose values are replaced.
	Headers []string
	// Fields are RFC 6901 JSON pointers into the body whose values are
	// replaced.
	Fields []string
}

// Empty reports whether the rules redact nothing.
func (r Redaction) Empty() bool { return len(r.Headers) == 0 && len(r.Fields) == 0 }

// RedactResult is what Apply changed.
type RedactResult struct {
	Headers amqp.Table
	Body    []byte
	// Changed lists the header names and body pointers that were replaced.
	Changed []string
	// Failed says why body fields could not be redacted ("" if they could or
	// none were configured). The body is then kept as received.
	Failed string
}

// Apply returns scrubbed copies of headers and body; the inputs are not
// modified. Bodies are re-encoded only when a configured field was present,
// so a message with nothing to redact keeps its exact bytes.
func (r Redaction) Apply(headers amqp.Table, body []byte) RedactResult {
	res := RedactResult{Headers: make(amqp.Table, len(headers)), Body: body}
	for k, v := range headers {
		res.Headers[k] = v
	}
	for _, name := range r.Headers {
		for k := range res.Headers {
			if strings.EqualFold(k, name) {
				res.Headers[k] = Redacted
				res.Changed = append(res.Changed, "header:"+k)
			}
		}
	}
	if len(r.Fields) == 0 {
		return res
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		res.Failed = "body is not JSON; fields not redacted"
		return res
	}
	var changed []string
	for _, ptr := range r.Fields {
		if replaceAt(doc, ptr) {
			changed = append(changed, "body:"+ptr)
		}
	}
	if len(changed) == 0 {
		return res
	}
	out, err := json.Marshal(doc)
	if err != nil {
		res.Failed = "re-encoding the redacted body failed: " + err.Error()
		return res
	}
	res.Body = out
	res.Changed = append(res.Changed, changed...)
	return res
}

// replaceAt sets the value at ptr to Redacted; it reports whether the
// pointer resolved.
func replaceAt(doc any, ptr string) bool {
	if ptr == "" || ptr[0] != '/' {
		return false
	}
	parts := strings.Split(ptr[1:], "/")
	cur := doc
	for i, raw := range parts {
		tok := strings.ReplaceAll(strings.ReplaceAll(raw, "~1", "/"), "~0", "~")
		last := i == len(parts)-1
		switch node := cur.(type) {
		case map[string]any:
			v, ok := node[tok]
			if !ok {
				return false
			}
			if last {
				node[tok] = Redacted
				return true
			}
			cur = v
		case []any:
			idx, err := strconv.Atoi(tok)
			if err != nil || idx < 0 || idx >= len(node) {
				return false
			}
			if last {
				node[idx] = Redacted
				return true
			}
			cur = node[idx]
		default:
			return false
		}
	}
	return false
}
