package triage

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlxbridge/dlxbridge/wire"
)

// HeaderSignature is the bridge's signature over its own retry state (the
// headers a Signer is given), bound to one work queue and one message:
// "v1:" and the base64url HMAC-SHA256. Without a valid signature those
// headers are the publisher's, and nothing trusts them.
const HeaderSignature = wire.HeaderSignature

// SignedHeaders are the bridge's retry state: the headers a retry, a
// re-admission or a replay carries back into a work queue, and that decide
// something there. The runtime trusts them only under a valid
// HeaderSignature, which binds them to the work queue, the message id and
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

// HeaderReadmitted marks a message the bridge re-admitted into its work queue
// (ActionReadmit). Its value is XDeathDigest of the message's x-death at that
// moment; signed, it tells Precheck that the broker's delivery count on this
// copy is the work queue's own.
const HeaderReadmitted = wire.HeaderReadmitted

// MinKeyBytes is the shortest signing key NewSigner accepts.
const MinKeyBytes = 16

const sigPrefix = "v1:"

// Signer signs and verifies the bridge's retry headers with HMAC-SHA256.
// It is safe for concurrent use.
type Signer struct {
	key []byte
}

// NewSigner returns a Signer for key, which must be at least MinKeyBytes
// long (a random 32-byte key is best).
func NewSigner(key []byte) (*Signer, error) {
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("triage: signing key is %d bytes, want at least %d", len(key), MinKeyBytes)
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

// Sign returns the HeaderSignature value over the headers named in fields,
// as they are in h (an absent header is signed as absent). Strings and byte
// arrays sign as strings, integers of any type as their decimal value;
// other types as their type name, which no verifier will match by chance.
// A nil Signer returns "".
func (s *Signer) Sign(sub Subject, h map[string]any, fields []string) string {
	if s == nil {
		return ""
	}
	return sigPrefix + base64.RawURLEncoding.EncodeToString(s.mac(sub, h, fields))
}

// Verify checks h's HeaderSignature against the headers named in fields. It
// compares in constant time and never panics.
func (s *Signer) Verify(sub Subject, h map[string]any, fields []string) Verification {
	if s == nil {
		return Verification{Problem: "no signing key"}
	}
	raw, present := h[HeaderSignature]
	if !present {
		return Verification{Problem: "no " + HeaderSignature}
	}
	str, ok := wire.String(raw)
	if !ok || !strings.HasPrefix(str, sigPrefix) {
		return Verification{Problem: HeaderSignature + " is malformed"}
	}
	got, err := base64.RawURLEncoding.DecodeString(str[len(sigPrefix):])
	if err != nil || len(got) != sha256.Size {
		return Verification{Problem: HeaderSignature + " is malformed"}
	}
	if !hmac.Equal(got, s.mac(sub, h, fields)) {
		return Verification{Problem: HeaderSignature + " does not match (another key, queue or message, or altered headers)"}
	}
	return Verification{Valid: true}
}

// mac is HMAC-SHA256 over a length-prefixed, typed encoding of the subject
// and the fields, so that no two different inputs encode alike.
func (s *Signer) mac(sub Subject, h map[string]any, fields []string) []byte {
	m := hmac.New(sha256.New, s.key)
	put := func(tag byte, b []byte) {
		var n [9]byte
		n[0] = tag
		binary.BigEndian.PutUint64(n[1:], uint64(len(b)))
		m.Write(n[:])
		m.Write(b)
	}
	put('v', []byte("dlxbridge retry state v1"))
	put('q', []byte(sub.Queue))
	put('m', []byte(sub.MessageID))
	body := sha256.Sum256(sub.Body)
	put('b', body[:])
	for _, name := range fields {
		put('n', []byte(name))
		if v, present := h[name]; present {
			putValue(put, v)
		} else {
			put('-', nil)
		}
	}
	return m.Sum(nil)
}

func putValue(put func(byte, []byte), v any) {
	if s, ok := wire.String(v); ok {
		put('s', []byte(s))
		return
	}
	if n, res := wire.Int(v); res == wire.IntOK {
		put('i', strconv.AppendInt(nil, n, 10))
		return
	}
	put('?', []byte(wire.TypeName(v)))
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
