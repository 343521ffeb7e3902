package quarantine

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/jsonscan"
)

// redactedValue replaces every redacted value.
const redactedValue = "[redacted]"

// redactedJSON is what a redacted body value becomes: redactedValue as a JSON
// string.
const redactedJSON = `"` + redactedValue + `"`

// Redaction says what to scrub before a message is quarantined.
type Redaction struct {
	// Headers are header names (case-insensitive) whose values are
	// replaced, also as keys of tables nested in a header's value.
	Headers []string
	// Fields are RFC 6901 JSON pointers into the body whose values are
	// replaced.
	Fields []string
	// MaxBodyBytes is the largest body whose fields are redacted; a larger
	// one is kept as received, and RedactResult.Failed says why. 0 or less
	// means no limit.
	MaxBodyBytes int
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

// headerNamed reports whether a header or nested table key is one of the
// names to redact.
func (r Redaction) headerNamed(k string) bool {
	for _, name := range r.Headers {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// maxRedactDepth bounds the walk into nested header tables and arrays; AMQP
// lets a producer nest them deeply. A table or array deeper than that is
// replaced whole: nothing shows it free of a redacted name, and the
// quarantine publish carries it before the record drops it (see storable).
const maxRedactDepth = 64

// maxNestedChanged bounds how many nested hits Changed lists by path: a
// path can be 64 keys of 255 bytes, and one header frame can hold
// thousands of nested tables with a redacted key, so listing every path
// would cost hundreds of megabytes for one delivery. The rest are counted
// in one last entry.
const maxNestedChanged = 100

// nestedWalk is one walk of a header's value: the path to the value in
// hand as segments, joined only for a hit (most values are no hit, and a
// path string per value would cost as much as the listing), and the hits.
type nestedWalk struct {
	r       Redaction
	path    []string // "header:k", then ".key" or "[i]" per level
	changed *[]string
	listed  int // nested hits listed in changed
	more    int // nested hits past maxNestedChanged
}

func (w *nestedWalk) hit() {
	if w.listed < maxNestedChanged {
		*w.changed = append(*w.changed, strings.Join(w.path, ""))
		w.listed++
		return
	}
	w.more++
}

// redact returns a copy of v (an AMQP table or array, at any depth) with
// the values of keys named in r.Headers replaced, noting each hit; ok is
// false when nothing in v matched (v is then not copied). A secret a
// producer nests in a table header is scrubbed as a top-level one is.
func (w *nestedWalk) redact(v any, depth int) (any, bool) {
	if depth > maxRedactDepth {
		switch v.(type) {
		case amqp.Table, []any:
			w.hit()
			return redactedValue, true
		}
		return nil, false
	}
	switch t := v.(type) {
	case amqp.Table:
		var out amqp.Table
		for k, inner := range t {
			w.path = append(w.path, "."+k)
			nv, hit := inner, false
			if w.r.headerNamed(k) {
				nv, hit = redactedValue, true
				w.hit()
			} else {
				nv, hit = w.redact(inner, depth+1)
			}
			w.path = w.path[:len(w.path)-1]
			if hit {
				if out == nil {
					out = maps.Clone(t)
				}
				out[k] = nv
			}
		}
		return out, out != nil
	case []any:
		var out []any
		for i, inner := range t {
			w.path = append(w.path, "["+strconv.Itoa(i)+"]")
			nv, hit := w.redact(inner, depth+1)
			w.path = w.path[:len(w.path)-1]
			if hit {
				if out == nil {
					out = slices.Clone(t)
				}
				out[i] = nv
			}
		}
		return out, out != nil
	}
	return nil, false
}

// Apply returns scrubbed copies of headers and body; the inputs are not
// modified.
//
// The body is read in one streaming pass and only the
// values at configured pointers are rewritten, each to "[redacted]"; every
// other byte (key order, whitespace, escapes, number spelling) stays as
// received, and a body with nothing to redact is returned as is. It costs a
// copy of the body when something is redacted, and memory proportional to
// the nesting depth otherwise, at any depth. A body of several JSON values
// one after another (trailing data) has each value redacted, each from its
// own root. A body over MaxBodyBytes, or one that is not JSON, is kept as
// received and Failed says so.
func (r Redaction) Apply(headers amqp.Table, body []byte) RedactResult {
	res := RedactResult{Headers: make(amqp.Table, len(headers)), Body: body}
	for k, v := range headers {
		res.Headers[k] = v
	}
	if len(r.Headers) > 0 {
		w := &nestedWalk{r: r, changed: &res.Changed}
		for k, v := range res.Headers {
			if r.headerNamed(k) {
				res.Headers[k] = redactedValue
				res.Changed = append(res.Changed, "header:"+k)
				continue
			}
			w.path = append(w.path[:0], "header:"+k)
			if nv, ok := w.redact(v, 1); ok {
				res.Headers[k] = nv
			}
		}
		slices.Sort(res.Changed) // map order is random; the list is not
		if w.more > 0 {
			res.Changed = append(res.Changed, "header:(and "+strconv.Itoa(w.more)+" more nested)")
		}
	}
	if len(r.Fields) == 0 {
		return res
	}
	if r.MaxBodyBytes > 0 && len(body) > r.MaxBodyBytes {
		res.Failed = "not redacted: body over max_body_bytes (" + strconv.Itoa(len(body)) + " > " + strconv.Itoa(r.MaxBodyBytes) + " bytes)"
		return res
	}
	root, fields := compileFields(r.Fields)
	out, found, err := redactBody(body, root, len(fields))
	if err != nil {
		res.Failed = "not redacted: body is not JSON (" + frame.Truncate(err.Error(), 200) + ")"
		return res
	}
	for i, ok := range found {
		if ok {
			res.Changed = append(res.Changed, "body:"+fields[i])
		}
	}
	res.Body = out
	return res
}

// fieldNode is one step of the configured pointers, as a tree: the tokens
// of every pointer that passes through it lead to its children.
type fieldNode struct {
	keys map[string]*fieldNode
	// indices are the children whose token is an array index (RFC 6901:
	// "0" or digits without a leading zero), so elements are matched
	// without formatting each index.
	indices map[int]*fieldNode
	field   int // index of the pointer ending here in the fields list, or -1
}

func (n *fieldNode) child(tok string) *fieldNode {
	if c := n.keys[tok]; c != nil {
		return c
	}
	c := &fieldNode{field: -1}
	if n.keys == nil {
		n.keys = map[string]*fieldNode{}
	}
	n.keys[tok] = c
	if i, err := strconv.Atoi(tok); err == nil && i >= 0 && strconv.Itoa(i) == tok {
		if n.indices == nil {
			n.indices = map[int]*fieldNode{}
		}
		n.indices[i] = c
	}
	return c
}

// compileFields builds the tree of the pointers; it returns it with the
// pointers it holds (duplicates and non-pointers left out), in order.
func compileFields(ptrs []string) (*fieldNode, []string) {
	root := &fieldNode{field: -1}
	var fields []string
	for _, ptr := range ptrs {
		if ptr == "" || ptr[0] != '/' {
			continue
		}
		n := root
		for _, raw := range strings.Split(ptr[1:], "/") {
			n = n.child(strings.ReplaceAll(strings.ReplaceAll(raw, "~1", "/"), "~0", "~"))
		}
		if n.field < 0 {
			n.field = len(fields)
			fields = append(fields, ptr)
		}
	}
	return root, fields
}

// level is an open array or object on the path of some configured pointer.
type level struct {
	node  *fieldNode
	obj   bool
	depth int        // the scanner's depth inside it
	next  *fieldNode // object: the node of the member whose key was just read
	index int        // array: the index of the next element
}

// redactBody copies body with the value at every configured pointer replaced
// by redactedJSON, or returns body itself if there is none. found says which
// of the n fields were present. Only containers on a configured path are
// tracked; everything else is just scanned.
func redactBody(body []byte, root *fieldNode, n int) (out []byte, found []bool, err error) {
	sc := jsonscan.New(body)
	found = make([]bool, n)
	var path []level
	copied := 0 // body[:copied] is in out
	for {
		depth := sc.Depth()
		tok, err := sc.Next()
		if err != nil {
			return nil, nil, err
		}
		var node *fieldNode
		var top *level
		if len(path) > 0 && path[len(path)-1].depth == depth {
			top = &path[len(path)-1]
		}
		switch tok.Kind {
		case jsonscan.EOF:
			if out == nil {
				return body, found, nil
			}
			return append(out, body[copied:]...), found, nil
		case jsonscan.EndObject, jsonscan.EndArray:
			if top != nil {
				path = path[:len(path)-1]
			}
			continue
		case jsonscan.Key:
			if top != nil {
				top.next = top.node.keys[string(sc.Text(tok))]
			}
			continue
		}
		// A value (or the start of one) at depth.
		switch {
		case depth == 0:
			node = root
		case top == nil:
			continue
		case top.obj:
			node, top.next = top.next, nil
		default:
			if top.node.indices != nil {
				node = top.node.indices[top.index]
			}
			top.index++
		}
		if node == nil {
			continue
		}
		begin := tok.Kind == jsonscan.BeginObject || tok.Kind == jsonscan.BeginArray
		if node.field < 0 {
			if begin {
				path = append(path, level{node: node, obj: tok.Kind == jsonscan.BeginObject, depth: depth + 1})
			}
			continue
		}
		end := tok.End
		for begin && sc.Depth() > depth { // skip the container's contents
			t, err := sc.Next()
			if err != nil {
				return nil, nil, err
			}
			end = t.End
		}
		if out == nil {
			out = make([]byte, 0, len(body)+len(redactedJSON))
		}
		out = append(append(out, body[copied:tok.Start]...), redactedJSON...)
		copied = end
		found[node.field] = true
	}
}
