package quarantine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// A record is what a quarantine keeps of one quarantined message. The
// intake (the quarantine queue, a quorum queue that the broker's dead
// letters and the runtime's quarantine publishes arrive in) is drained by a
// Keeper into the records stream, one stream message per record:
//
//	headers: dlxbridge-record-id, dlxbridge-record-intake (short strings, for people reading the stream)
//	body:    "DLXREC2\n", a 4-byte big-endian length m, m bytes of binary meta, a 4-byte length h,
//	         h bytes of headers (marshalTable), then the payload as received (see recordbin.go)
//
// Records of layout 1 ("DLXREC1\n", a 4-byte length n, n bytes of JSON
// meta with the headers inside, then the payload) are still read. The meta
// holds every AMQP property and the original header table in the
// typed encoding of marshalTable, because a stream drops header values that
// are arrays or tables (and the broker's x-death on 3.10). They travel in
// the body, not in a header, so a record never exceeds a frame (a
// quarantined message's headers may already fill one), and the user-id
// property is kept without the broker checking it against the keeper's
// login.

// recordMagic starts every record body of layout 1 (JSON meta),
// recordMagic2 of layout 2 (binary meta, see recordbin.go) and recordMagic3
// of layout 3 (layout 2 and whether the envelope was verified), which the
// keeper writes; the digit is the layout version. All are read.
const (
	recordMagic  = "DLXREC1\n"
	recordMagic2 = "DLXREC2\n"
	recordMagic3 = "DLXREC3\n"
)

// ErrNotRecord: a stream message that is not a record in a layout this
// version reads.
var ErrNotRecord = errors.New("quarantine: not a record")

// Properties are the AMQP properties of a quarantined message as received.
type Properties struct {
	ContentType     string    `json:"content_type,omitempty"`
	ContentEncoding string    `json:"content_encoding,omitempty"`
	DeliveryMode    uint8     `json:"delivery_mode,omitempty"`
	Priority        uint8     `json:"priority,omitempty"`
	CorrelationID   string    `json:"correlation_id,omitempty"`
	ReplyTo         string    `json:"reply_to,omitempty"`
	Expiration      string    `json:"expiration,omitempty"`
	MessageID       string    `json:"message_id,omitempty"`
	Timestamp       time.Time `json:"timestamp,omitzero"`
	Type            string    `json:"type,omitempty"`
	UserID          string    `json:"user_id,omitempty"`
	AppID           string    `json:"app_id,omitempty"`
}

func propertiesOf(d *amqp.Delivery) Properties {
	return Properties{
		ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode,
		Priority: d.Priority, CorrelationID: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration,
		MessageID: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, UserID: d.UserId, AppID: d.AppId,
	}
}

// recordMeta is the JSON part of a record body.
type recordMeta struct {
	ID         string          `json:"id"`
	Intake     string          `json:"intake"`
	StoredAt   time.Time       `json:"stored_at"`
	Exchange   string          `json:"exchange"`
	RoutingKey string          `json:"routing_key"`
	Props      Properties      `json:"properties"`
	Headers    json.RawMessage `json:"headers"`
	// Envelope, Redrives and Version are read from the headers when the
	// record is written, so that listing a stream needs no header decode.
	Envelope *Envelope `json:"envelope,omitempty"`
	Redrives int       `json:"redrive_count,omitempty"`
	Version  string    `json:"version_header,omitempty"`
}

// recordID is a quarantined message's stable, short id: the first 12 hex
// digits of a SHA-256 over what the message is (the exchange and routing
// key it reached the intake with, its properties, its headers but the
// delivery counts (x-delivery-count, and on 4.3 x-acquired-count), which a
// redelivery changes, and its payload). A record
// written twice (a keeper that crashed between the stream's confirm and the
// intake's ack) has the same id, and readers keep one. Unlike a stream
// offset, it survives retention.
func recordID(d *amqp.Delivery) (string, error) {
	h := amqp.Table{}
	for k, v := range storable(d.Headers) {
		if !wire.IsCountHeader(k) {
			h[k] = v
		}
	}
	enc, err := marshalTable(h)
	if err != nil {
		return "", err
	}
	props, _ := json.Marshal(propertiesOf(d))
	sum := sha256.New()
	for _, part := range [][]byte{[]byte(d.Exchange), []byte(d.RoutingKey), props, enc, d.Body} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		sum.Write(n[:])
		sum.Write(part)
	}
	return hex.EncodeToString(sum.Sum(nil))[:12], nil
}

// notKept replaces a header value that a record cannot keep.
const notKept = "[not kept in the quarantine record: nested deeper than the record encoding reads back]"

// storable returns h with every value that marshalTable refuses (a table or
// array nested deeper than maxCodecDepth, which amqp091-go and the broker
// take from a producer) replaced by notKept, so that a producer's header
// never keeps a message out of its record: the keeper would otherwise
// return it to the intake for ever.
func storable(h amqp.Table) amqp.Table {
	var out amqp.Table
	for k, v := range h {
		if _, err := encodeValue(v, 1); err != nil {
			if out == nil {
				out = maps.Clone(h)
			}
			out[k] = notKept
		}
	}
	if out == nil {
		return h
	}
	return out
}

// encodeRecord turns an intake delivery into the stream message that keeps
// it.
// With v (the runtime's signing key) the envelope is read by ReadVerified.
func encodeRecord(d *amqp.Delivery, intake string, now time.Time, v *triage.Signer) (amqp.Publishing, string, error) {
	return encodeKept(d, intake, now, v, Redaction{}, nil)
}

// encodeStub is the record of a message whose full record the broker
// refused as too large: everything but the payload, and why (refusal is the
// broker's answer). Its id is the full record's.
func encodeStub(d *amqp.Delivery, intake string, now time.Time, v *triage.Signer, red Redaction, refusal error) (amqp.Publishing, string, error) {
	return encodeKept(d, intake, now, v, red, &PayloadOmitted{
		Reason: "the message with its record was over the broker's max message size (" + refusal.Error() + ")",
		Bytes:  len(d.Body),
	})
}

// encodeKept is the record of d as it reached intake, with red applied
// (see redactUnverified) unless the envelope verifies, and the payload
// left out when omitted is set. The envelope's verdict is computed from d
// as it arrived (the signature covers what was published); the id from
// what is kept, as for a message the runtime redacted: an id over the
// unredacted message would let anyone who reads the record try candidate
// values of a short secret (a PIN, a card's last digits) until one gives
// the id. Redaction is deterministic, so a record written twice still has
// one id.
func encodeKept(d *amqp.Delivery, intake string, now time.Time, v *triage.Signer, red Redaction, omitted *PayloadOmitted) (amqp.Publishing, string, error) {
	env, _ := ReadVerified(d, v) // d is the message as published: its body too
	// The count is kept as the keeper's verdict, on d as published: a claim
	// no signature vouches for is no prior replay, and a note keeps it.
	redriven, note := trustedRedrives(d, v, env.Verified)
	if note != "" {
		env.Notes = append(env.Notes, note)
	}
	kept := d
	if !env.Verified && !red.Empty() {
		kept = redactUnverified(d, &env, red)
		resignRedrives(kept, d, v, note == "")
	}
	id, err := recordID(kept)
	if err != nil {
		return amqp.Publishing{}, "", err
	}
	headers, err := marshalTable(storable(kept.Headers))
	if err != nil {
		return amqp.Publishing{}, "", err
	}
	env.PayloadOmitted = omitted
	payload := kept.Body
	if omitted != nil {
		payload = nil
	}
	return recordPublishing(&recordMeta{
		ID: id, Intake: intake, StoredAt: now.UTC(), Exchange: d.Exchange, RoutingKey: d.RoutingKey,
		Props: propertiesOf(d), Envelope: &env,
		Redrives: redriven, Version: wireval.Str(kept.Headers, versionHeader),
	}, headers, payload), id, nil
}

// recordPublishing is the stream message of a record in layout 3: m, the
// headers in their typed encoding and the payload.
func recordPublishing(m *recordMeta, headers, payload []byte) amqp.Publishing {
	meta := appendMeta(nil, m)
	body := make([]byte, 0, len(recordMagic3)+8+len(meta)+len(headers)+len(payload))
	body = append(body, recordMagic3...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(meta)))
	body = append(body, meta...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(headers)))
	body = append(body, headers...)
	body = append(body, payload...)
	return amqp.Publishing{
		Headers:      amqp.Table{wire.HeaderRecordID: m.ID, wire.HeaderRecordIntake: m.Intake},
		ContentType:  "application/vnd.dlxbridge.record",
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Body:         body,
	}
}

// resignRedrives signs kept's redrive count again over its redacted body
// when the replay's redrive signature on d (as published) verified
// (trusted): the replay with the key checks the count again from the
// stored record, whose body is no longer the one the replay signed. The
// keeper holds the same key as the replay, and vouches only for what it
// verified.
func resignRedrives(kept, d *amqp.Delivery, v *triage.Signer, trusted bool) {
	if _, claimed := kept.Headers[wire.HeaderRedriveCount]; !claimed || !trusted || v == nil || bytes.Equal(kept.Body, d.Body) {
		return
	}
	kept.Headers = maps.Clone(kept.Headers)
	kept.Headers[wire.HeaderRedriveSignature] = v.SignRedrive(kept.MessageId, kept.Body, kept.Headers)
}

// keeperRedactedNote starts the note of a record the keeper redacted: the
// envelope's Redacted and RedactionFailed then say what the keeper did,
// not what the message's headers claim.
const keeperRedactedNote = "redacted by the quarantine keeper"

// redactUnverified applies red to a message that the runtime did not
// redact under a verified envelope (a broker dead letter, an envelope no
// valid signature vouches for, or any envelope when the keeper has no
// key), the way the runtime redacts what it quarantines: headers and body
// fields, within red.MaxBodyBytes. env (read from d as it arrived) gets
// what was changed or why the body was not, in place of anything the
// headers claimed, and a note that the keeper did it. A redacted
// idempotency key is redacted in the envelope's copy too (a claimed
// dlxbridge-idempotency-key header and env.IdempotencyKey). d is not
// modified; the returned copy holds the redacted headers and body.
func redactUnverified(d *amqp.Delivery, env *Envelope, red Redaction) *amqp.Delivery {
	res := red.Apply(d.Headers, d.Body)
	if res.Headers[wire.HeaderIdempotencyKey] == redactedValue {
		if _, ok := res.Headers[wire.HeaderIdempotencyKeyCopy]; ok {
			res.Headers[wire.HeaderIdempotencyKeyCopy] = redactedValue
		}
		if env.IdempotencyKey != "" {
			env.IdempotencyKey = redactedValue
		}
	}
	env.Redacted, env.RedactionFailed = res.Changed, res.Failed
	switch {
	case res.Failed != "":
		env.Notes = append(env.Notes, keeperRedactedNote+" (no valid envelope signature says the runtime had; rules applied twice change nothing): "+res.Failed)
	case len(res.Changed) > 0:
		env.Notes = append(env.Notes, keeperRedactedNote+" (no valid envelope signature says the runtime had; rules applied twice change nothing)")
	}
	kept := *d
	kept.Headers, kept.Body = res.Headers, res.Body
	return &kept
}

// versionHeader is the default schema version header, kept in a record's
// meta for filtering records whose envelope has no version.
const versionHeader = wire.DefaultVersionHeader

// decodeRecord reads a record body back (either layout): its meta and
// payload. The headers stay encoded in meta.Headers until someone asks for
// them; layout 2 needs no JSON decode at all.
func decodeRecord(body []byte) (*recordMeta, []byte, error) {
	switch {
	case bytes.HasPrefix(body, []byte(recordMagic3)), bytes.HasPrefix(body, []byte(recordMagic2)):
		layout3 := bytes.HasPrefix(body, []byte(recordMagic3))
		meta, rest, ok := cutSized(body[len(recordMagic3):])
		if !ok {
			return nil, nil, fmt.Errorf("%w: meta length over the body", ErrNotRecord)
		}
		headers, payload, ok := cutSized(rest)
		if !ok {
			return nil, nil, fmt.Errorf("%w: headers length over the body", ErrNotRecord)
		}
		m, err := readMeta(meta, layout3)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrNotRecord, err)
		}
		m.Headers = headers
		return m, payload, nil
	case bytes.HasPrefix(body, []byte(recordMagic)):
		meta, payload, ok := cutSized(body[len(recordMagic):])
		if !ok {
			return nil, nil, fmt.Errorf("%w: meta length over the body", ErrNotRecord)
		}
		var m recordMeta
		if err := json.Unmarshal(meta, &m); err != nil {
			return nil, nil, fmt.Errorf("%w: meta: %v", ErrNotRecord, err)
		}
		if m.Envelope != nil {
			// No keeper checked a signature for layout 1: a "verified" in
			// its JSON is someone's claim.
			m.Envelope.Verified = false
		}
		return &m, payload, nil
	}
	return nil, nil, ErrNotRecord
}

// cutSized splits b after a 4-byte big-endian length and that many bytes.
func cutSized(b []byte) (part, rest []byte, ok bool) {
	if len(b) < 4 {
		return nil, nil, false
	}
	n := binary.BigEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(len(b)) {
		return nil, nil, false
	}
	return b[:n:n], b[n:], true
}

// Keeper drains one quarantine's intake into its records stream: each
// message is published to the stream (mandatory, confirmed) and only then
// acked on the intake, the same confirm-before-ack rule as every other
// move. A crash in between leaves the message on the intake and its record
// in the stream; it is written again with the same id, and readers keep
// one. It tolerates an intake that already holds messages when it starts.
type Keeper struct {
	// Consume reads the intake; Publish writes the stream (they may be the
	// same connection). Required.
	Consume, Publish *amqp.Connection
	// Intake is the quarantine queue; Records its records stream. Required.
	Intake, Records string
	// Prefetch bounds unacked intake messages. Defaults to 50.
	Prefetch int
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Verifier, with the runtime's signing key, verifies each envelope as
	// its record is written (see ReadVerified): an envelope no valid
	// signature vouches for is kept as a claim in the record's notes, and
	// the record reads as the broker's dead letter. A redrive count no
	// signature vouches for is stored as 0, its claim in the notes (see
	// trustedRedrives). Without it the record keeps the envelope and the
	// count as its headers claim them, the envelope marked not verified.
	// Defaults to nil.
	Verifier *triage.Signer
	// Redaction is applied to every record whose envelope is not Verified
	// (a message the broker dead-lettered on its own, an envelope no valid
	// signature vouches for, and every record when Verifier is nil) before
	// it is stored, as the runtime applies it to what it quarantines; a
	// verified envelope's message was redacted by the runtime and is kept
	// as it arrived. The record's envelope says what was redacted, with a
	// note starting "redacted by the quarantine keeper". Defaults to none.
	Redaction Redaction
	// Metrics, with Config (the file naming this intake's work queues),
	// counts each record as it is stored, so that the open-records gauge
	// moves at once rather than at the next Metrics.Refresh. Defaults to
	// nil: nothing counted here.
	Metrics *Metrics
	Config  *config.Config
	// kept, when set, is called after each record is acked (tests).
	kept  func(id string)
	moved atomic.Int64
	// set is the config's quarantine set of Intake, found once (count).
	setOnce sync.Once
	set     *quarantineSet
}

// Run keeps records until ctx ends (then returns nil) or a channel fails (an
// error; the caller restarts it with backoff). A message whose record
// cannot be written is rejected with requeue, never acked; one whose
// record the broker refuses as over its max message size is stored as a
// stub without its payload (see encodeStub), and acked once that is
// confirmed.
func (k *Keeper) Run(ctx context.Context) error {
	now, log, prefetch := k.Now, k.Logger, k.Prefetch
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	if prefetch <= 0 {
		prefetch = 50
	}
	pub, err := amqpx.NewPublisher(k.Publish)
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }() // pub is replaced after a refusal
	ch, err := k.Consume.Channel()
	if err != nil {
		return fmt.Errorf("keeper %s: open channel: %w", k.Intake, err)
	}
	defer func() {
		// An ack written just before its channel closes can be lost (seen
		// on 3.10.8); the message would then be stored twice (same id).
		time.Sleep(20 * time.Millisecond)
		_ = ch.Close()
	}()
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fmt.Errorf("keeper %s: prefetch: %w", k.Intake, err)
	}
	// Not ConsumeWithContext: its cancel races the channel close below and
	// can leave Close waiting forever. Closing the channel cancels the
	// consumer; the broker requeues what is unacked.
	deliveries, err := ch.Consume(k.Intake, consumerTag("keeper"), false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("keeper %s: consume: %w", k.Intake, err)
	}
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case d, ok = <-deliveries:
		}
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("keeper %s: intake channel closed", k.Intake)
		}
		msg, id, err := encodeKept(&d, k.Intake, now(), k.Verifier, k.Redaction, nil)
		if err != nil {
			// Cannot happen for anything amqp091-go decoded; never ack it.
			log.Error("quarantine keeper: cannot encode a record; left on the intake", "intake", k.Intake, "error", err)
			_ = d.Nack(false, true)
			return fmt.Errorf("keeper %s: %w", k.Intake, err)
		}
		// Not WithoutCancel: during a resource alarm the confirm comes only
		// when the alarm clears, and the runtime's stop waits for the
		// keeper. A record written but not acked is written again with the
		// same id, and readers keep one.
		err = pub.Publish(ctx, "", k.Records, msg)
		if err != nil && tooLarge(err) && ctx.Err() == nil {
			// Its payload can never be stored: keep the rest of it, or it
			// stays in the intake for ever and stops every record behind it.
			log.Warn("quarantine keeper: record over the broker's max message size; storing it without its payload",
				"intake", k.Intake, "id", id, "payload_bytes", len(d.Body), "error", err)
			err = k.publishStub(ctx, &pub, &d, now(), err)
		}
		if err != nil {
			_ = d.Nack(false, true)
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("keeper %s: write record to %s (was the topology applied?): %w", k.Intake, k.Records, err)
		}
		if err := d.Ack(false); err != nil {
			return fmt.Errorf("keeper %s: ack: %w", k.Intake, err)
		}
		k.moved.Add(1)
		k.count(msg.Body, now())
		if k.kept != nil {
			k.kept(id)
		}
	}
}

// count tells Metrics about a record just stored (its body as written).
func (k *Keeper) count(body []byte, now time.Time) {
	if k.Metrics == nil || k.Config == nil {
		return
	}
	k.setOnce.Do(func() {
		for _, set := range (&Inspector{Config: k.Config}).quarantines() {
			if set.cfg.Quarantine.Queue == k.Intake {
				k.set = set
			}
		}
	})
	if k.set == nil {
		return
	}
	if r, err := recordFrom(body, 0, k.set); err == nil {
		k.Metrics.stored(r, now)
	}
}

// Moved is how many records this Keeper has stored and acked, over all its
// runs: a supervisor resets its backoff after a run that moved some.
func (k *Keeper) Moved() int64 { return k.moved.Load() }

// publishStub stores d's stub record after the broker refused its full
// record (refusal), on a new publisher, since the refusal closed the old
// one's channel. Only a confirmed stub lets the caller ack d.
func (k *Keeper) publishStub(ctx context.Context, pub **amqpx.Publisher, d *amqp.Delivery, now time.Time, refusal error) error {
	stub, _, err := encodeStub(d, k.Intake, now, k.Verifier, k.Redaction, refusal)
	if err != nil {
		return err
	}
	_ = (*pub).Close()
	p, err := amqpx.NewPublisher(k.Publish)
	if err != nil {
		return err
	}
	*pub = p
	return p.Publish(ctx, "", k.Records, stub)
}

// tooLarge: the broker refused a publish for its size. It closes the
// channel (406 PRECONDITION_FAILED, "message size N is larger than
// configured max size M", or "… than max size M" at the broker's ceiling;
// seen on 3.10.8 and 4.0.5; see amqpx.TooLargeError).
func tooLarge(err error) bool {
	if !errors.Is(err, amqpx.ErrPublisherClosed) {
		return false
	}
	_, _, ok := amqpx.ParseTooLarge(err.Error())
	return ok
}
