// Package frame fits a publishing's content header frame into the
// connection's frame_max. A larger header frame makes the broker close the
// whole connection with FRAME_ERROR, which requeues everything in flight
// on it, so every publishing the bridge builds from a delivery (a retry, a
// re-admission, a quarantine record) goes through Fit before it is sent.
// The text caps the bridge's own headers keep to live here too, because
// Fit rewrites the notes and dropped headers within them.
package frame

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/wire"
)

// DefaultFrameSize is the broker's default frame_max (3.x and 4.x), the
// frame size amqp091-go negotiates unless the client asks for less. A
// content header frame (every property, the header table included) must
// fit one frame: a larger one makes the broker close the whole connection
// with FRAME_ERROR, which requeues everything in flight on it.
const DefaultFrameSize = 131072

// frameOverhead is a frame's type (1 octet), channel (2), payload size (4)
// and frame-end (1). AMQP 0-9-1 counts them in frame_max, and so does Fit;
// RabbitMQ tolerates a payload of up to frame_max (8 bytes more; seen on
// 3.10.8 and 4.0.5), which leaves Fit that margin.
const frameOverhead = 8

// maxShortstr is the longest AMQP short string (message id, type, ...).
// amqp091-go writes its length as uint8(len): a longer value is silently
// cut to len%256 bytes (a 256-byte message id goes out empty).
const maxShortstr = 255

// Bounds of what Fit keeps and writes.
const (
	// MinDetailBytes is what a detail text header (an error text, say) is
	// cut to before details are dropped whole.
	MinDetailBytes = 256
	// MaxDroppedBytes bounds wire.HeaderDropped.
	MaxDroppedBytes = 1024
	// MaxNotesBytes bounds wire.HeaderNotes (and the quarantine envelope's
	// other lists).
	MaxNotesBytes = 2048
	// MaxErrorBytes bounds an error text in a header (a retry's last error,
	// the envelope's error and reason).
	MaxErrorBytes = 2048
)

// ErrNoFit: the message cannot be made to fit one frame without changing
// what the caller said must not change. It was not, and must not be, sent.
var ErrNoFit = errors.New("message does not fit one frame")

// Rank says how Fit may shrink a header to make a publish fit one frame,
// and in which order: lower ranks first, and within a step the largest
// header first, until the frame fits; then every step that later ones made
// unnecessary is undone, the latest (most valuable) first. The order (also
// in the README's wire contract):
//
//  1. ProducerHeader: dropped whole.
//  2. DetailHeader: a text value cut to MinDetailBytes; then, if that is
//     not enough, details are dropped whole (structured values, JSON or
//     tables, are never cut, only dropped).
//  3. TraceHeader: dropped whole.
//  4. IdentityHeader: dropped whole.
//  5. EssentialHeader: a string value over 255 bytes is cut to 255 (no
//     AMQP name, id or routing key is longer); never dropped.
//  6. FixedHeader: never changed. If the rest cannot make room, Fit fails
//     with ErrNoFit.
//
// The body is never touched. Every change is recorded (see Fit).
type Rank int

// Ranks, in the order Fit uses them.
const (
	// ProducerHeader: a header the bridge does not own (custom headers).
	ProducerHeader Rank = iota
	// DetailHeader: the bridge's informational headers (error texts,
	// validation errors, times, worker) and the broker's x-death history.
	DetailHeader
	// TraceHeader: W3C trace context (traceparent, tracestate, baggage).
	TraceHeader
	// IdentityHeader: the schema version header and idempotency-key (the
	// envelope keeps a copy of the key).
	IdentityHeader
	// EssentialHeader: what the record cannot do without: class, reason,
	// attempts, fingerprint, where the message came from, the
	// idempotency key's copy.
	EssentialHeader
	// FixedHeader: must travel unchanged (a retry's producer headers).
	FixedHeader
)

// Fit makes p's content header frame fit frameMax (0 means
// DefaultFrameSize), changing only p's headers, and those in Rank order.
// Short-string properties over 255 bytes (which the client would silently
// cut) are cut to 255 on a UTF-8 boundary first. When Fit changes anything
// it records it in two headers that it owns and rewrites: wire.HeaderDropped
// lists what was dropped or cut ("header:<name>", "property:<name>"), and
// one note saying so, with sizes, is appended to wire.HeaderNotes (earlier notes
// and entries are kept as far as MaxNotesBytes and MaxDroppedBytes allow,
// the newest first). It returns the entries it added to wire.HeaderDropped.
//
// If the frame cannot be made to fit, Fit returns ErrNoFit and p must not
// be sent (its headers may be partly trimmed already). A nil error means
// HeaderFrameSize(p) <= frameMax.
func Fit(p *amqp.Publishing, frameMax int, rank func(name string) Rank) ([]string, error) {
	if frameMax <= 0 {
		frameMax = DefaultFrameSize
	}
	var changes []change
	for _, f := range shortstrProperties(p) {
		if len(*f.v) > maxShortstr {
			*f.v, changes = Truncate(*f.v, maxShortstr), append(changes, change{what: "property:" + f.name, from: len(*f.v), to: maxShortstr})
		}
	}
	if len(changes) == 0 && HeaderFrameSize(p) <= frameMax {
		return nil, nil
	}
	if p.Headers == nil {
		p.Headers = amqp.Table{}
	}
	h := p.Headers
	// The record's own headers: taken out now, rewritten at the end, and
	// room kept for them meanwhile.
	notes, ok := stringList(h[wire.HeaderNotes])
	if !ok {
		changes = append(changes, change{what: "header:" + wire.HeaderNotes, from: byteLen(h[wire.HeaderNotes]), note: "not a JSON array of strings; replaced"})
	}
	listed, _ := stringList(h[wire.HeaderDropped])
	delete(h, wire.HeaderNotes)
	delete(h, wire.HeaderDropped)

	size := HeaderFrameSize(p)
	if len(h) == 0 {
		size += 4 // the table the record will add
	}
	budget := frameMax - fieldSize(wire.HeaderNotes, strings.Repeat("x", MaxNotesBytes)) - fieldSize(wire.HeaderDropped, strings.Repeat("x", MaxDroppedBytes))
	// Shrink in Rank order until the headers fit, remembering each step...
	type step struct {
		name string
		old  any
	}
	var steps []step
	original := map[string]any{}
	var order []string
	for _, s := range fitSteps {
		for _, k := range byRank(h, rank, s.rank) {
			if size <= budget {
				break
			}
			old := h[k]
			v, keep := s.shrink(old)
			if keep && fieldSize(k, v) == fieldSize(k, old) {
				continue
			}
			if keep {
				h[k] = v
			} else {
				delete(h, k)
			}
			size += sizeIn(h, k) - fieldSize(k, old)
			steps = append(steps, step{k, old})
			if _, seen := original[k]; !seen {
				original[k] = old
				order = append(order, k)
			}
		}
	}
	// ...then undo, latest (most valuable) first, each step the later ones
	// made unnecessary: a detail need not go because a 130 KB trace header
	// went after it.
	for i := len(steps) - 1; i >= 0; i-- {
		st := steps[i]
		if delta := fieldSize(st.name, st.old) - sizeIn(h, st.name); size+delta <= budget {
			h[st.name] = st.old
			size += delta
		}
	}
	for _, k := range order {
		c := change{what: "header:" + k, from: byteLen(original[k]), to: -1}
		if v, ok := h[k]; ok {
			if fieldSize(k, v) == fieldSize(k, original[k]) {
				continue // put back whole
			}
			c.to = byteLen(v)
		}
		changes = append(changes, c)
	}

	added := make([]string, len(changes))
	for i, c := range changes {
		added[i] = c.what
	}
	// The record, in full if it fits (earlier notes and drops too), else
	// just this Fit's note and entries, cut short.
	note := fitNote(changes, frameMax)
	for _, limit := range []int{MaxNotesBytes, maxShortstr} {
		h[wire.HeaderDropped] = EncodeStrings(append(listed, added...), min(limit, MaxDroppedBytes))
		h[wire.HeaderNotes] = EncodeStrings(append(notes, Truncate(note, limit-4)), limit)
		if HeaderFrameSize(p) <= frameMax {
			return added, nil
		}
	}
	return added, fmt.Errorf("%w: its content header frame is %d bytes, frame_max %d; largest headers it may not change: %s",
		ErrNoFit, HeaderFrameSize(p), frameMax, strings.Join(largest(h, rank, 3), ", "))
}

// fitSteps is the Rank order as steps; shrink returns the value to keep
// (keep=false: drop the header).
var fitSteps = []struct {
	rank   Rank
	shrink func(v any) (out any, keep bool)
}{
	{ProducerHeader, drop},
	{DetailHeader, cutText(MinDetailBytes)},
	{DetailHeader, drop},
	{TraceHeader, drop},
	{IdentityHeader, drop},
	{EssentialHeader, cutText(maxShortstr)},
}

func drop(any) (any, bool) { return nil, false }

// cutText cuts a string over n bytes to n; other values (and JSON text,
// which a cut would make unreadable) are left alone.
func cutText(n int) func(v any) (any, bool) {
	return func(v any) (any, bool) {
		s, ok := v.(string)
		if !ok || len(s) <= n || strings.HasPrefix(s, "[") || strings.HasPrefix(s, "{") {
			return v, true
		}
		return Truncate(s, n), true
	}
}

// change is one thing Fit did, with value lengths (see byteLen); to is -1
// for a drop.
type change struct {
	what     string
	from, to int
	note     string
}

// fitNote says what Fit changed, naming at most 8 things (wire.HeaderDropped
// has the list).
func fitNote(changes []change, frameMax int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "to fit one %d-byte frame:", frameMax)
	for i, c := range changes {
		if i == 8 {
			fmt.Fprintf(&b, " and %d more (see %s)", len(changes)-i, wire.HeaderDropped)
			break
		}
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s", Truncate(strings.Replace(c.what, ":", " ", 1), 80))
		switch {
		case c.note != "":
			fmt.Fprintf(&b, " (%d bytes) %s", c.from, c.note)
		case c.to < 0:
			fmt.Fprintf(&b, " (%d bytes) dropped", c.from)
		default:
			fmt.Fprintf(&b, " cut from %d to %d bytes", c.from, c.to)
		}
	}
	return b.String()
}

// sizeIn is the encoded size of h's field k, 0 if absent.
func sizeIn(h amqp.Table, k string) int {
	if v, ok := h[k]; ok {
		return fieldSize(k, v)
	}
	return 0
}

// byteLen is a value's length for a note: its bytes for a string or byte
// array, else its encoded size.
func byteLen(v any) int {
	switch x := v.(type) {
	case string:
		return len(x)
	case []byte:
		return len(x)
	}
	return valueSize(v)
}

// byRank lists h's headers of rank r, largest first (ties by name).
func byRank(h amqp.Table, rank func(string) Rank, r Rank) []string {
	type field struct {
		name string
		size int
	}
	var fs []field
	for k, v := range h {
		if rank(k) == r {
			fs = append(fs, field{k, fieldSize(k, v)})
		}
	}
	sort.Slice(fs, func(i, j int) bool {
		if fs[i].size != fs[j].size {
			return fs[i].size > fs[j].size
		}
		return fs[i].name < fs[j].name
	})
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.name
	}
	return names
}

// largest names up to n of the headers Fit may not drop: fixed ones
// first, each rank largest first.
func largest(h amqp.Table, rank func(string) Rank, n int) []string {
	var out []string
	for _, r := range []Rank{FixedHeader, EssentialHeader} {
		for _, k := range byRank(h, rank, r) {
			if len(out) < n && k != wire.HeaderNotes && k != wire.HeaderDropped {
				out = append(out, fmt.Sprintf("%s (%d bytes)", Truncate(k, 80), byteLen(h[k])))
			}
		}
	}
	return out
}

// stringList reads a header holding a JSON array of strings (see
// wireval.StringList). An absent header is an empty list; ok is false only for
// a value of another shape.
func stringList(v any) (list []string, ok bool) {
	if v == nil {
		return nil, true
	}
	return wireval.StringList(v)
}

type namedString struct {
	name string
	v    *string
}

// shortstrProperties are p's short-string properties.
func shortstrProperties(p *amqp.Publishing) []namedString {
	return []namedString{
		{"content-type", &p.ContentType}, {"content-encoding", &p.ContentEncoding},
		{"correlation-id", &p.CorrelationId}, {"reply-to", &p.ReplyTo},
		{"expiration", &p.Expiration}, {"message-id", &p.MessageId},
		{"type", &p.Type}, {"user-id", &p.UserId}, {"app-id", &p.AppId},
	}
}

// HeaderFrameSize is the size in bytes of the content header frame
// amqp091-go v1.10 writes for p (write.go: headerFrame.write), frame
// overhead included: the number the broker compares with frame_max. The
// payload is class (2), weight (2), body size (8), property flags (2), then
// each property that is set: short strings (1-byte length + bytes), the
// header table, delivery mode and priority (1 each), timestamp (8).
func HeaderFrameSize(p *amqp.Publishing) int {
	n := frameOverhead + 2 + 2 + 8 + 2
	for _, f := range shortstrProperties(p) {
		if len(*f.v) > 0 {
			n += 1 + len(*f.v)%256 // uint8(len), as amqp091-go writes it
		}
	}
	if len(p.Headers) > 0 {
		n += tableSize(p.Headers)
	}
	if p.DeliveryMode > 0 {
		n++
	}
	if p.Priority > 0 {
		n++
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// EncodedSize is the size of v in AMQP 0-9-1 field-table encoding, as
// amqp091-go v1.10 writes it (write.go: writeTable, writeField): a table is
// a 4-byte length and, per field, a short-string key, a type tag and the
// value; arrays are a 4-byte length and tagged values.
func EncodedSize(v any) int {
	if t, ok := v.(amqp.Table); ok {
		return tableSize(t)
	}
	return valueSize(v)
}

func tableSize(t amqp.Table) int {
	n := 4
	for k, v := range t {
		n += fieldSize(k, v)
	}
	return n
}

// fieldSize: key (1-byte length + bytes, cut like any short string), type
// tag, value.
func fieldSize(k string, v any) int { return 1 + len(k)%256 + 1 + valueSize(v) }

// valueSize is the size of a field value without its type tag.
func valueSize(v any) int {
	switch x := v.(type) {
	case nil:
		return 0
	case bool, int8, uint8:
		return 1
	case int16:
		return 2
	case int, int32, float32: // amqp091-go writes an int as a 32-bit 'I'
		return 4
	case int64, float64, time.Time:
		return 8
	case amqp.Decimal:
		return 5
	case string:
		return 4 + len(x)
	case []byte:
		return 4 + len(x)
	case amqp.Table:
		return tableSize(x)
	case []any:
		n := 4
		for _, e := range x {
			n += 1 + valueSize(e)
		}
		return n
	}
	// A type amqp091-go refuses to encode (ErrFieldType): the publish fails
	// before any frame is written.
	return 0
}

// Truncate cuts s to at most n bytes on a UTF-8 boundary, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…[truncated]"
	cut := n - len(mark)
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// EncodeStrings keeps as many of the newest (last) strings as fit limit
// bytes of JSON: notes are appended hop after hop, and the latest say most
// about the message as it is now. Linear in the input, which may come from
// a producer's header.
func EncodeStrings(ss []string, limit int) string {
	if len(ss) == 0 {
		return ""
	}
	size, from := 1, len(ss) // "[", then each string with its "," or "]"
	for from > 0 {
		b, _ := json.Marshal(ss[from-1])
		if size+len(b)+1 > limit {
			break
		}
		size += len(b) + 1
		from--
	}
	if from == len(ss) {
		return `["too large to record"]`
	}
	b, _ := json.Marshal(ss[from:])
	return string(b)
}
