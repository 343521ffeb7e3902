package quarantine

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/dlxbridge/dlxbridge/triage"
)

// Layout 3 (recordMagic3) is layout 2 with one more byte at the end of the
// binary meta: Envelope.Verified (1) or not (0). Layout 2 is still read,
// as unverified.
//
// Layout 2 of a record body (recordMagic2) keeps what listing reads in a
// small binary meta and the header table apart, so that reading a stream
// decodes no JSON at all:
//
//	"DLXREC2\n"
//	4-byte big-endian length m, m bytes of binary meta
//	4-byte big-endian length h, h bytes of the headers in marshalTable's encoding (decoded on first use)
//	the payload as received
//
// The binary meta is a fixed sequence of fields (see appendMeta): strings
// and lists as a uvarint length then their bytes or items, integers as
// varints, a time as 0 (zero time) or 1 followed by its Unix seconds
// (varint) and nanoseconds (uvarint). A field added to recordMeta,
// Properties or Envelope needs a new layout digit; TestRecordMetaFields
// fails until it has one. Layout 1 (JSON meta with the headers inside) is
// still read.

// errMeta: a binary meta that ends early or runs over.
var errMeta = errors.New("binary meta malformed")

type metaWriter []byte

func (w *metaWriter) str(s string) {
	*w = binary.AppendUvarint(*w, uint64(len(s)))
	*w = append(*w, s...)
}

func (w *metaWriter) strs(ss []string) {
	*w = binary.AppendUvarint(*w, uint64(len(ss)))
	for _, s := range ss {
		w.str(s)
	}
}

func (w *metaWriter) int(n int64) { *w = binary.AppendVarint(*w, n) }

func (w *metaWriter) time(t time.Time) {
	if t.IsZero() {
		*w = append(*w, 0)
		return
	}
	*w = append(*w, 1)
	*w = binary.AppendVarint(*w, t.Unix())
	*w = binary.AppendUvarint(*w, uint64(t.Nanosecond()))
}

// appendMeta writes m (its Headers excepted) in the binary meta layout.
func appendMeta(b []byte, m *recordMeta) []byte {
	w := metaWriter(b)
	w.str(m.ID)
	w.str(m.Intake)
	w.time(m.StoredAt)
	w.str(m.Exchange)
	w.str(m.RoutingKey)
	p := &m.Props
	w.str(p.ContentType)
	w.str(p.ContentEncoding)
	w.int(int64(p.DeliveryMode))
	w.int(int64(p.Priority))
	w.str(p.CorrelationID)
	w.str(p.ReplyTo)
	w.str(p.Expiration)
	w.str(p.MessageID)
	w.time(p.Timestamp)
	w.str(p.Type)
	w.str(p.UserID)
	w.str(p.AppID)
	w.int(int64(m.Redrives))
	w.str(m.Version)
	e := m.Envelope
	if e == nil {
		e = &Envelope{}
	}
	w.str(e.Source)
	w.str(string(e.Class))
	w.str(e.Reason)
	w.str(e.Error)
	w.str(e.Fingerprint)
	w.int(int64(e.Attempts))
	w.time(e.FirstFailureAt)
	w.time(e.LastFailureAt)
	w.time(e.QuarantinedAt)
	w.str(e.OriginalExchange)
	w.str(e.OriginalRouting)
	w.str(e.OriginalQueue)
	w.str(e.MessageID)
	w.str(e.IdempotencyKey)
	w.str(e.MessageType)
	w.str(e.SchemaVersion)
	w = binary.AppendUvarint(w, uint64(len(e.Validation)))
	for _, v := range e.Validation {
		w.str(v.Pointer)
		w.str(v.Keyword)
		w.str(v.Message)
	}
	w.str(e.Traceparent)
	w.str(e.TraceID)
	w.str(e.WorkerHost)
	w.str(e.WorkerVersion)
	w.strs(e.Redacted)
	w.str(e.RedactionFailed)
	w.strs(e.Notes)
	w.strs(e.Dropped)
	w.str(e.Stack)
	if e.PayloadOmitted == nil {
		w = append(w, 0)
	} else {
		w = append(w, 1)
		w.str(e.PayloadOmitted.Reason)
		w.int(int64(e.PayloadOmitted.Bytes))
	}
	// Layout 3 (recordMagic3) adds the one byte below.
	if e.Verified {
		w = append(w, 1)
	} else {
		w = append(w, 0)
	}
	return w
}

// metaReader reads a binary meta. Its strings are substrings of one copy
// of the meta (one allocation per record, not one per field). After the
// first error every read returns a zero value and err stays set.
type metaReader struct {
	s   string
	err error
}

func (r *metaReader) fail() { r.err, r.s = errMeta, "" }

func (r *metaReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	var u uint64
	for i := 0; i < len(r.s) && i < binary.MaxVarintLen64; i++ {
		c := r.s[i]
		if i == binary.MaxVarintLen64-1 && c > 1 {
			break // over 64 bits
		}
		u |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			r.s = r.s[i+1:]
			return u
		}
	}
	r.fail()
	return 0
}

func (r *metaReader) int() int64 {
	u := r.uvarint()
	n := int64(u >> 1)
	if u&1 != 0 {
		n = ^n
	}
	return n
}

// count reads a length and checks that at least that many bytes remain
// (every item takes one).
func (r *metaReader) count() int {
	n := r.uvarint()
	if n > uint64(len(r.s)) {
		r.fail()
		return 0
	}
	return int(n)
}

// maxPrealloc bounds the items a list's count allocates before they are
// read: a forged count in garbage would otherwise allocate several times
// the meta's size (a Violation is 48 bytes, its encoding 3) before the
// first item fails.
const maxPrealloc = 64

func (r *metaReader) str() string {
	n := r.count()
	s := r.s[:n]
	r.s = r.s[n:]
	return s
}

func (r *metaReader) strs() []string {
	n := r.count()
	if n == 0 {
		return nil
	}
	out := make([]string, 0, min(n, maxPrealloc))
	for range n {
		if out = append(out, r.str()); r.err != nil {
			return nil
		}
	}
	return out
}

func (r *metaReader) byte() byte {
	if r.err != nil || len(r.s) == 0 {
		r.fail()
		return 0
	}
	c := r.s[0]
	r.s = r.s[1:]
	return c
}

func (r *metaReader) time() time.Time {
	switch r.byte() {
	case 0:
		return time.Time{}
	case 1:
		sec := r.int()
		ns := r.uvarint()
		if ns >= uint64(time.Second) {
			r.fail()
			return time.Time{}
		}
		return time.Unix(sec, int64(ns)).UTC()
	}
	r.fail()
	return time.Time{}
}

func (r *metaReader) u8() uint8 {
	n := r.int()
	if n < 0 || n > 255 {
		r.fail()
	}
	return uint8(n)
}

// readMeta reads a binary meta written by appendMeta (layout 3), or by its
// layout 2 version (without Envelope.Verified: such a record is
// unverified).
func readMeta(b []byte, layout3 bool) (*recordMeta, error) {
	r := metaReader{s: string(b)}
	m := &recordMeta{Envelope: &Envelope{}}
	m.ID = r.str()
	m.Intake = r.str()
	m.StoredAt = r.time()
	m.Exchange = r.str()
	m.RoutingKey = r.str()
	p := &m.Props
	p.ContentType = r.str()
	p.ContentEncoding = r.str()
	p.DeliveryMode = r.u8()
	p.Priority = r.u8()
	p.CorrelationID = r.str()
	p.ReplyTo = r.str()
	p.Expiration = r.str()
	p.MessageID = r.str()
	p.Timestamp = r.time()
	p.Type = r.str()
	p.UserID = r.str()
	p.AppID = r.str()
	m.Redrives = int(r.int())
	m.Version = r.str()
	e := m.Envelope
	e.Source = r.str()
	e.Class = triage.Class(r.str())
	e.Reason = r.str()
	e.Error = r.str()
	e.Fingerprint = r.str()
	e.Attempts = int(r.int())
	e.FirstFailureAt = r.time()
	e.LastFailureAt = r.time()
	e.QuarantinedAt = r.time()
	e.OriginalExchange = r.str()
	e.OriginalRouting = r.str()
	e.OriginalQueue = r.str()
	e.MessageID = r.str()
	e.IdempotencyKey = r.str()
	e.MessageType = r.str()
	e.SchemaVersion = r.str()
	if n := r.count(); n > 0 {
		e.Validation = make([]Violation, 0, min(n, maxPrealloc))
		for range n {
			if e.Validation = append(e.Validation, Violation{Pointer: r.str(), Keyword: r.str(), Message: r.str()}); r.err != nil {
				break
			}
		}
	}
	e.Traceparent = r.str()
	e.TraceID = r.str()
	e.WorkerHost = r.str()
	e.WorkerVersion = r.str()
	e.Redacted = r.strs()
	e.RedactionFailed = r.str()
	e.Notes = r.strs()
	e.Dropped = r.strs()
	e.Stack = r.str()
	switch r.byte() {
	case 0:
	case 1:
		e.PayloadOmitted = &PayloadOmitted{Reason: r.str(), Bytes: int(r.int())}
	default:
		r.fail()
	}
	if layout3 {
		switch r.byte() {
		case 0:
		case 1:
			e.Verified = true
		default:
			r.fail()
		}
	}
	if r.err == nil && r.s != "" {
		r.fail() // trailing bytes: not a layout this version writes
	}
	if r.err != nil {
		return nil, r.err
	}
	return m, nil
}
