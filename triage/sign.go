package triage

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/wire"
)

// SignedHeaders are the bridge's retry state: the headers a retry, a
// re-admission or a replay carries back into a work queue, and that decide
// something there. The runtime trusts them only under a valid
// wire.HeaderSignature, which binds them to the work queue, the message id and
// the body. The returned slice is a copy.
func SignedHeaders() []string {
	return []string{
		wire.HeaderAttempts,
		wire.HeaderFirstFailureAt,
		wire.HeaderOriginalExchange,
		wire.HeaderOriginalRoutingKey,
		wire.HeaderOriginalQueue,
		wire.HeaderNotes,
		wire.HeaderReadmitted,
	}
}

// MinKeyBytes is the shortest signing key NewSigner accepts.
const MinKeyBytes = 16

const sigPrefix = "v1:"

// Signer signs and verifies the bridge's retry headers with HMAC-SHA256.
// It is safe for concurrent use.
type Signer struct {
	key  []byte
	macs sync.Pool // of keyed HMAC-SHA256 hashes
}

// NewSigner returns a Signer for key, which must be at least MinKeyBytes
// long (a random 32-byte key is best).
func NewSigner(key []byte) (*Signer, error) {
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("triage: signing key is %d bytes, want at least %d", len(key), MinKeyBytes)
	}
	// Spaces or line breaks pad a short or empty key (an unfilled
	// template, a here-document) to the length without adding a secret.
	if n := len(bytes.TrimSpace(key)); n < MinKeyBytes {
		return nil, fmt.Errorf("triage: signing key is %d bytes besides the spaces and line breaks around it, want at least %d", n, MinKeyBytes)
	}
	return &Signer{key: append([]byte(nil), key...)}, nil
}

// Subject is what a signature is bound to, so that it can't be copied onto
// another message or carried into another queue.
type Subject struct {
	// Queue is the work queue the message (re-)enters.
	Queue     string
	MessageID string
	// Body is hashed into the signature: messages without an id are still
	// told apart.
	Body []byte
}

// Verification is the outcome of Signer.Verify.
type Verification struct {
	// Valid is true when the signature matches the named headers.
	Valid bool
	// Problem says why it is not valid ("no dlxbridge-signature", "it does
	// not match: …"); empty when Valid.
	Problem string
}

// Sign returns the wire.HeaderSignature value over the headers named in fields,
// as they are in h (an absent header is signed as absent). Strings and byte
// arrays sign as strings, integers of any type as their decimal value;
// other types as their type name, and Verify refuses them: such a
// signature would vouch for any value of the type.
// A nil Signer returns "".
func (s *Signer) Sign(sub Subject, h map[string]any, fields []string) string {
	return s.sign(domainRetry, sub, h, fields)
}

// The domains a Signer signs in: the first item of every encoding, so that
// a signature made for one use never verifies for another, whatever the
// fields.
const (
	domainRetry    = "dlxbridge retry state v1"
	domainEnvelope = "dlxbridge quarantine envelope v1"
	domainRedrive  = "dlxbridge redrive v1"
	domainEvent    = "dlxbridge quarantine event v1"
	domainJob      = "dlxbridge replay job v1"
)

// jobFields are what a replay job signature covers beside its subject.
var jobFields = []string{wire.HeaderReplayJob, wire.HeaderReplayRecord}

// SignReplayJob returns the wire.HeaderReplayJobSignature value over h's
// replay job and record (wire.HeaderReplayJob, wire.HeaderReplayRecord),
// for the message with messageID and body that the replay sends to queue,
// under a domain of its own. A replay with the key signs them, so that the
// runtime records what became of the message in that job only for a
// message the replay sent, settled in the queue it sent it to (a header is
// evidence: a producer could name any job, and a handler that forwards
// what it got copies the headers along). A nil Signer returns "".
func (s *Signer) SignReplayJob(queue, messageID string, body []byte, h map[string]any) string {
	return s.sign(domainJob, Subject{Queue: queue, MessageID: messageID, Body: body}, h, jobFields)
}

// VerifyReplayJob checks h's wire.HeaderReplayJobSignature for a message
// settled on queue, as Verify does.
func (s *Signer) VerifyReplayJob(queue, messageID string, body []byte, h map[string]any) Verification {
	return s.verify(domainJob, &jobSig, Subject{Queue: queue, MessageID: messageID, Body: body}, h, jobFields)
}

// redriveFields are what a redrive signature covers beside its subject. It
// is not in SignedHeaders: the retry signature encodes absent fields too,
// so adding one would void every retry in flight across an upgrade.
var redriveFields = []string{wire.HeaderRedriveCount}

// redriveSubject binds a redrive signature to the message (its id and
// body), not to a queue: the count must survive a replay to another queue
// and the broker's own dead-lettering of the replayed message, which
// changes neither.
func redriveSubject(messageID string, body []byte) Subject {
	return Subject{MessageID: messageID, Body: body}
}

// SignRedrive returns the wire.HeaderRedriveSignature value over h's
// dlxbridge-redrive-count (wire.HeaderRedriveCount), for the message with
// messageID and body, under a domain of its own: a retry or envelope
// signature never verifies as a redrive signature, nor the other way round.
// A replay with the consumers' key signs the count it sets, so that a
// reader with the key can tell it from a count a producer wrote (a header
// is evidence, never a command). A nil Signer returns "".
func (s *Signer) SignRedrive(messageID string, body []byte, h map[string]any) string {
	return s.sign(domainRedrive, redriveSubject(messageID, body), h, redriveFields)
}

// VerifyRedrive checks h's wire.HeaderRedriveSignature against its redrive count,
// as Verify does.
func (s *Signer) VerifyRedrive(messageID string, body []byte, h map[string]any) Verification {
	return s.verify(domainRedrive, &redriveSig, redriveSubject(messageID, body), h, redriveFields)
}

// SignEnvelope returns the wire.HeaderEnvelopeSignature value over the headers
// named in fields, as Sign does, under a domain of its own: a quarantine
// envelope's signature never verifies as retry state, nor the other way
// round. The runtime signs each envelope it writes; a reader with the key
// trusts an envelope only under a valid one (a message the broker
// dead-letters on its own keeps the producer's headers, a forged envelope
// included). A nil Signer returns "".
func (s *Signer) SignEnvelope(sub Subject, h map[string]any, fields []string) string {
	return s.sign(domainEnvelope, sub, h, fields)
}

// VerifyEnvelope checks h's wire.HeaderEnvelopeSignature against the headers
// named in fields, as Verify does.
func (s *Signer) VerifyEnvelope(sub Subject, h map[string]any, fields []string) Verification {
	return s.verify(domainEnvelope, &envelopeSig, sub, h, fields)
}

// eventSubject binds an event signature to the events stream it is
// written to and to the event's body as written: copied into another
// quarantine's stream, or with any byte changed, it no longer verifies.
func eventSubject(stream string, body []byte) Subject {
	return Subject{Queue: stream, Body: body}
}

// SignEvent returns the wire.HeaderEventSignature value for a quarantine
// event: body, as published, into the events stream stream. It signs
// under a domain of its own, so that no envelope, retry or redrive
// signature over the same bytes verifies as an event's (a producer can
// get the runtime to sign an envelope over a body it chose). A nil Signer
// returns "".
func (s *Signer) SignEvent(stream string, body []byte) string {
	return s.sign(domainEvent, eventSubject(stream, body), nil, nil)
}

// VerifyEvent checks h's wire.HeaderEventSignature against body, read from
// the events stream stream, as Verify does.
func (s *Signer) VerifyEvent(stream string, body []byte, h map[string]any) Verification {
	return s.verify(domainEvent, &eventSig, eventSubject(stream, body), h, nil)
}

func (s *Signer) sign(domain string, sub Subject, h map[string]any, fields []string) string {
	if s == nil {
		return ""
	}
	sum, _ := s.mac(domain, sub, h, fields)
	// Encoded on the stack: a concatenation of EncodeToString's result
	// was three allocations for one value.
	var buf [len(sigPrefix) + sigEncodedLen]byte
	b := append(buf[:0], sigPrefix...)
	return string(base64.RawURLEncoding.AppendEncode(b, sum[:]))
}

// sigEncodedLen is the length of a MAC in unpadded base64.
const sigEncodedLen = (sha256.Size*8 + 5) / 6

// Placeholder is a value of the size of every signature this Signer makes
// (Sign's result for any input), and no valid signature: room kept for one
// while the headers it will cover are still being fitted. A nil Signer
// returns "", as Sign does.
func (s *Signer) Placeholder() string {
	if s == nil {
		return ""
	}
	return placeholder
}

var placeholder = sigPrefix + strings.Repeat("-", sigEncodedLen)

// Verify checks h's wire.HeaderSignature against the headers named in fields. It
// compares in constant time and never panics.
func (s *Signer) Verify(sub Subject, h map[string]any, fields []string) Verification {
	return s.verify(domainRetry, &retrySig, sub, h, fields)
}

// sigHeader is a signature header and its problems, spelled once: a
// problem built per call would cost every unsigned delivery an allocation.
type sigHeader struct{ name, missing, malformed, mismatch, unsigned string }

// unsignedValue is the problem of a signed header whose value is neither a
// string nor an integer: the bridge never writes one, and the encoding
// holds only its type name, so any other value of the type would match.
const unsignedValue = " cannot vouch for a signed header that is neither a string nor an integer"

var (
	retrySig = sigHeader{wire.HeaderSignature, "no " + wire.HeaderSignature, wire.HeaderSignature + " is malformed",
		wire.HeaderSignature + " does not match (another key, queue or message, or altered headers)",
		wire.HeaderSignature + unsignedValue}
	envelopeSig = sigHeader{wire.HeaderEnvelopeSignature, "no " + wire.HeaderEnvelopeSignature, wire.HeaderEnvelopeSignature + " is malformed",
		wire.HeaderEnvelopeSignature + " does not match (another key, exchange or message, or altered headers)",
		wire.HeaderEnvelopeSignature + unsignedValue}
	redriveSig = sigHeader{wire.HeaderRedriveSignature, "no " + wire.HeaderRedriveSignature, wire.HeaderRedriveSignature + " is malformed",
		wire.HeaderRedriveSignature + " does not match (another key or message, or an altered count)",
		wire.HeaderRedriveSignature + unsignedValue}
	jobSig = sigHeader{wire.HeaderReplayJobSignature, "no " + wire.HeaderReplayJobSignature, wire.HeaderReplayJobSignature + " is malformed",
		wire.HeaderReplayJobSignature + " does not match (another key or message, or an altered job)",
		wire.HeaderReplayJobSignature + unsignedValue}
	eventSig = sigHeader{wire.HeaderEventSignature, "no " + wire.HeaderEventSignature, wire.HeaderEventSignature + " is malformed",
		wire.HeaderEventSignature + " does not match (another key or stream, or an altered event)",
		wire.HeaderEventSignature + unsignedValue}
)

// verify checks the signature in header sh, made in domain.
func (s *Signer) verify(domain string, sh *sigHeader, sub Subject, h map[string]any, fields []string) Verification {
	if s == nil {
		return Verification{Problem: "no signing key"}
	}
	raw, present := h[sh.name]
	if !present {
		return Verification{Problem: sh.missing}
	}
	str, ok := wireval.String(raw)
	// A valid value is 46 bytes: a longer one is not decoded.
	if !ok || !strings.HasPrefix(str, sigPrefix) || len(str) != len(placeholder) {
		return Verification{Problem: sh.malformed}
	}
	// Decoded on the stack: DecodeString allocates its result.
	var enc [sigEncodedLen]byte
	var got [sha256.Size + 2]byte // room for Decode's last quantum
	copy(enc[:], str[len(sigPrefix):])
	n, err := base64.RawURLEncoding.Decode(got[:], enc[:])
	if err != nil || n != sha256.Size {
		return Verification{Problem: sh.malformed}
	}
	want, encoded := s.mac(domain, sub, h, fields)
	if !hmac.Equal(got[:n], want[:]) {
		return Verification{Problem: sh.mismatch}
	}
	if !encoded {
		return Verification{Problem: sh.unsigned}
	}
	return Verification{Valid: true}
}

// mac is HMAC-SHA256 over a length-prefixed, typed encoding of the subject
// and the fields, so that no two different inputs encode alike. The
// encoding is built in one buffer and hashed with a pooled HMAC: a retry is
// signed once on the way out and verified on the way back, and the
// encoding's many small writes were most of a retry's allocations.
// encoded is false when a field's value is neither a string nor an integer:
// that value is encoded as its type name only (see Sign), so the MAC vouches
// for the type, not the value, and verify refuses it.
func (s *Signer) mac(domain string, sub Subject, h map[string]any, fields []string) (sum [sha256.Size]byte, encoded bool) {
	e := encodings.Get().(*encoding)
	defer func() {
		if cap(e.b) <= maxPooledEncoding { // a hostile header's size is not kept
			encodings.Put(e)
		}
	}()
	e.b = e.b[:0]
	e.put('v', domain)
	e.put('q', sub.Queue)
	e.put('m', sub.MessageID)
	body := sha256.Sum256(sub.Body)
	e.putBytes('b', body[:])
	encoded = true
	for _, name := range fields {
		e.put('n', name)
		if v, present := h[name]; present {
			encoded = e.putValue(v) && encoded
		} else {
			e.put('-', "")
		}
	}
	m, _ := s.macs.Get().(hash.Hash)
	if m == nil {
		m = hmac.New(sha256.New, s.key)
	}
	m.Reset()
	m.Write(e.b)
	// Summed into the pooled buffer, past the encoding: Sum(nil) would
	// allocate.
	copy(sum[:], m.Sum(e.b[len(e.b):]))
	s.macs.Put(m)
	return sum, encoded
}

// encoding is mac's buffer: per item a tag, the length as 8 bytes big
// endian, the bytes.
type encoding struct{ b []byte }

const maxPooledEncoding = 4 << 10

var encodings = sync.Pool{New: func() any { return &encoding{b: make([]byte, 0, 512)} }}

func (e *encoding) put(tag byte, s string) {
	e.b = append(e.b, tag)
	e.b = binary.BigEndian.AppendUint64(e.b, uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoding) putBytes(tag byte, b []byte) {
	e.b = append(e.b, tag)
	e.b = binary.BigEndian.AppendUint64(e.b, uint64(len(b)))
	e.b = append(e.b, b...)
}

// putValue: strings and byte arrays as strings, integers of any type as
// their decimal value, anything else as its type name (and then false).
func (e *encoding) putValue(v any) bool {
	if s, ok := wireval.String(v); ok {
		e.put('s', s)
		return true
	}
	if n, res := wireval.Int(v); res == wireval.IntOK {
		var digits [20]byte
		e.putBytes('i', strconv.AppendInt(digits[:0], n, 10))
		return true
	}
	e.put('?', wireval.TypeName(v))
	return false
}

// XDeathDigest is a short digest of a message's x-death history: every
// entry's queue, reason, count, exchange, routing keys and time, in order.
// It is "" when there is no valid entry.
func XDeathDigest(headers map[string]any) string {
	h := HistoryOf(headers)
	if len(h.Deaths) == 0 {
		return ""
	}
	d := sha256.New()
	put := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		d.Write(n[:])
		d.Write([]byte(s))
	}
	for _, e := range h.Deaths {
		put(e.Queue)
		put(e.Reason)
		put(strconv.FormatInt(e.Count, 10))
		put(e.Exchange)
		put(strings.Join(e.RoutingKeys, "\x00"))
		if e.Time.IsZero() {
			put("")
		} else {
			put(e.Time.UTC().Format(time.RFC3339))
		}
	}
	return base64.RawURLEncoding.EncodeToString(d.Sum(nil)[:16])
}
