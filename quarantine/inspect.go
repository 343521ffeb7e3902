package quarantine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/payload"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// State is where a record stands.
type State string

const (
	// StateOpen: waiting for someone to replay or purge it.
	StateOpen State = "open"
	// StateReplayed: sent back (a "replayed" event names it).
	StateReplayed State = "replayed"
	// StatePurged: resolved without sending (a "purged" event names it).
	StatePurged State = "purged"
	// StateExpired: older than the quarantine's retention and never
	// resolved. It is counted, not dropped; the stream's x-max-age removes
	// it from the broker later.
	StateExpired State = "expired"
)

// Record is one quarantined message as the quarantine keeps it.
type Record struct {
	// ID is stable and short: the first 12 hex digits of a hash of the
	// message as it reached the intake, so a record written twice has one.
	ID string `json:"id"`
	// Queue is the work queue the message failed on.
	Queue string `json:"queue"`
	// Intake is the quarantine queue it arrived in.
	Intake string `json:"intake"`
	// Offset is its position in the records stream (not stable across
	// retention; use ID).
	Offset   int64     `json:"offset"`
	StoredAt time.Time `json:"stored_at"`
	State    State     `json:"state"`
	// Resolution is the event that replayed or purged it.
	Resolution *Event `json:"resolution,omitempty"`
	// Envelope is the bridge's failure envelope, or one derived from x-death
	// for a message the broker dead-lettered itself.
	Envelope   Envelope     `json:"envelope"`
	Owner      config.Owner `json:"owner"`
	Redrives   int          `json:"redrive_count"`
	Properties Properties   `json:"properties"`
	// Exchange and RoutingKey are what it reached the intake with.
	Exchange   string `json:"intake_exchange"`
	RoutingKey string `json:"intake_routing_key"`
	// Body is the payload exactly as received; Headers returns the headers.
	Body []byte `json:"-"`

	version     string // the schema-version header
	rawHeaders  json.RawMessage
	headersOnce sync.Once
	headers     amqp.Table
}

// Headers returns the message's headers exactly as received (decoded on
// first use: listing a large quarantine never needs them). A record whose
// header encoding cannot be read has none.
func (r *Record) Headers() amqp.Table {
	r.headersOnce.Do(func() {
		if r.headers == nil {
			r.headers, _ = unmarshalTable(r.rawHeaders)
		}
		if r.headers == nil {
			r.headers = amqp.Table{}
		}
	})
	return r.headers
}

// Seen is when the message was quarantined (the envelope's time, else when
// its record was stored).
func (r *Record) Seen() time.Time {
	if !r.Envelope.QuarantinedAt.IsZero() {
		return r.Envelope.QuarantinedAt
	}
	if !r.Envelope.LastFailureAt.IsZero() {
		return r.Envelope.LastFailureAt
	}
	return r.StoredAt
}

// MarshalJSON adds the headers in their typed encoding and the payload (as
// text when it is UTF-8 JSON or text, else base64).
func (r *Record) MarshalJSON() ([]byte, error) {
	type plain Record
	headers, err := marshalTable(r.Headers())
	if err != nil {
		return nil, err
	}
	out := struct {
		*plain
		Headers json.RawMessage `json:"headers"`
		Payload string          `json:"payload,omitempty"`
		Base64  []byte          `json:"payload_base64,omitempty"`
	}{plain: (*plain)(r), Headers: headers}
	if payload.IsText(r.Body) {
		out.Payload = string(r.Body)
	} else {
		out.Base64 = r.Body
	}
	return json.Marshal(out)
}

// Inspector reads quarantines without changing them: listing, showing and
// counting read the records and events streams by offset, which consumes
// nothing, so two readers see the same records in the same order and a
// reader that dies midway loses nothing. It serves the CLI and the metrics.
type Inspector struct {
	// Conn reads the streams. Required.
	Conn *amqp.Connection
	// Config names the quarantines, owners and retention. Required.
	Config *config.Config
	// Now is the clock (record ages, expiry). Defaults to time.Now.
	Now func() time.Time
	// OmitBodies makes Snapshot keep no payloads: each Record's Body is
	// nil, and nothing it holds shares memory with the message it was read
	// from, so a snapshot of a large quarantine costs its records' meta,
	// not their payloads. ReadBody reads one record's payload. Defaults to
	// false: every Body is kept.
	OmitBodies bool

	// Verifier, with the signing key (the operators' and the runtime's:
	// security.signing_key_env), checks each event's signature: once an
	// events stream holds a signed event, an event after it without a
	// valid signature changes nothing (Event.Ignored), whoever published
	// it. Without one, every event counts, as before events were signed,
	// and none is Verified. Defaults to nil.
	Verifier *triage.Signer

	// eventWaits, in tests, replaces how long reading an events stream
	// waits for its end (a reader on a loaded machine that stops early).
	eventWaits streamWaits
}

// quarantineSet is one quarantine queue and the work queues that use it.
type quarantineSet struct {
	cfg    *config.Queue // the first work queue naming it
	queues []*config.Queue
	// unrouted marks the shared tiers' catch-all (cfg is
	// config.Config.UnroutedQuarantine): its records are retries whose
	// work queue was gone when they came back, and queues are the work
	// queues on the shared tiers.
	unrouted bool
}

// has reports whether queue is one of s's work queues.
func (s *quarantineSet) has(queue string) bool {
	for _, q := range s.queues {
		if q.Name == queue {
			return true
		}
	}
	return false
}

func (in *Inspector) quarantines() []*quarantineSet {
	var out []*quarantineSet
	byName := map[string]*quarantineSet{}
	for i := range in.Config.Queues {
		q := &in.Config.Queues[i]
		s, ok := byName[q.Quarantine.Queue]
		if !ok {
			s = &quarantineSet{cfg: q}
			byName[q.Quarantine.Queue] = s
			out = append(out, s)
		}
		s.queues = append(s.queues, q)
	}
	if u, ok := in.Config.UnroutedQuarantine(); ok {
		s := &quarantineSet{cfg: u, unrouted: true}
		for i := range in.Config.Queues {
			if q := &in.Config.Queues[i]; q.Retry.Shared() {
				s.queues = append(s.queues, q)
			}
		}
		out = append(out, s)
	}
	return out
}

func (in *Inspector) now() time.Time {
	if in.Now != nil {
		return in.Now()
	}
	return time.Now()
}

// Snapshot is every record and event of the configured quarantines at one
// moment, records in stream order (quarantines in config order), each id
// once.
type Snapshot struct {
	Records []*Record
	Events  []Event
	// Intake is how many messages wait in each intake queue for the keeper
	// (the runtime) to store them.
	Intake map[string]int
	// Undecodable counts stream messages that are not records.
	Undecodable int
	// Gone are the records an expired event names that the broker's
	// retention has removed from the records stream (and no replay or
	// purge resolved): still counted as expired by Stats and the metrics
	// until their event expires too (the events stream keeps twice as
	// long). They are not listed.
	Gone []ExpiredRecord
	At   time.Time
	byID map[string]*Record
	// expiredNamed: the ids some expired event names.
	expiredNamed map[string]bool
	// unsigned, when read with a Verifier, are the events streams in which
	// no event verified (see Replayer.StartSigning).
	unsigned []string
}

// Snapshot reads every quarantine's streams.
func (in *Inspector) Snapshot(ctx context.Context) (*Snapshot, error) {
	return in.snapshot(ctx, nil)
}

// snapshot reads every quarantine's streams; an events stream that marks
// names (by its run) is read up to that claimed event, not to the end
// lastOffset finds (see Replayer.claim).
func (in *Inspector) snapshot(ctx context.Context, marks map[string]string) (*Snapshot, error) {
	sets := in.quarantines()
	type part struct {
		records []*Record
		events  []Event
		waiting int
		bad     int
		err     error
	}
	parts := make([]part, len(sets))
	var wg sync.WaitGroup
	for i, s := range sets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := &parts[i]
			// The two streams are read at once: finding that a stream is
			// empty takes streamWaits.empty.
			var evErr error
			evDone := make(chan struct{})
			go func() {
				defer close(evDone)
				stream := s.cfg.Quarantine.EventsStream()
				p.events, evErr = readEvents(ctx, in.Conn, stream, in.eventWaits, marks[stream], in.Verifier)
			}()
			p.records, p.bad, p.err = in.readRecords(ctx, s)
			<-evDone
			if p.err == nil {
				p.err = evErr
			}
			if p.err == nil {
				p.waiting, p.err = intakeDepth(in.Conn, s.cfg.Quarantine.Queue)
			}
		}()
	}
	wg.Wait()
	snap := &Snapshot{At: in.now(), Intake: map[string]int{}, byID: map[string]*Record{}}
	resolvedBy := map[string]*Event{}
	expiredBy := map[string]*ExpiredRecord{}
	var expiredOrder []string
	var perStream [][]Event
	at := map[string]int{} // each record's index in snap.Records
	for i, s := range sets {
		p := &parts[i]
		if p.err != nil {
			return nil, p.err
		}
		snap.Undecodable += p.bad
		snap.Intake[s.cfg.Quarantine.Queue] = p.waiting
		signed := false
		for j := range p.events {
			e := &p.events[j]
			e.Quarantine = s.cfg.Quarantine.Queue
			if j == 0 {
				perStream = append(perStream, p.events)
			}
			signed = signed || e.Verified
			if e.Ignored {
				continue // listed in Events, and nothing else
			}
			if e.Kind == EventReplayed || e.Kind == EventPurged {
				for _, id := range e.IDs {
					if _, done := resolvedBy[id]; !done {
						resolvedBy[id] = e
					}
				}
			}
			if e.Kind != EventExpired {
				continue // an aged-out event's entries say why, not that it is gone
			}
			for k := range e.Expired {
				// An entry counts under a work queue of the quarantine whose
				// stream holds the event (anyone who may write the stream can
				// name any queue, class or number of them).
				if x := &e.Expired[k]; x.ID != "" && expiredBy[x.ID] == nil && s.has(x.Queue) {
					expiredBy[x.ID] = x
					expiredOrder = append(expiredOrder, x.ID)
				}
			}
		}
		if in.Verifier != nil && !signed {
			snap.unsigned = append(snap.unsigned, s.cfg.Quarantine.EventsStream())
		}
		for _, r := range p.records {
			// A record written again (a keeper's retry, or carried forward
			// before retention deletes its segment: see
			// Replayer.CarryForward) is one record: the copy stored last,
			// at its place in the order of the first, so that its offset
			// is the one that outlives the older segment.
			if prev, dup := snap.byID[r.ID]; dup {
				if r.StoredAt.After(prev.StoredAt) {
					snap.Records[at[r.ID]] = r
					snap.byID[r.ID] = r
				}
				continue
			}
			snap.byID[r.ID] = r
			at[r.ID] = len(snap.Records)
			snap.Records = append(snap.Records, r)
		}
	}
	snap.Events = mergeEvents(perStream)
	for _, r := range snap.Records {
		r.State = StateOpen
		if e, ok := resolvedBy[r.ID]; ok {
			ev := *e
			ev.IDs = nil
			r.Resolution = &ev
			r.State = State(e.Kind)
			continue
		}
		// A record still in the stream is expired by this reader's own
		// retention, never by an event: an expired event is evidence only
		// for a record that is gone (anyone who may write the events stream
		// could otherwise hide an open record from replay, and a runtime
		// with a shorter retention or a fast clock would expire records for
		// good).
		if retention := retention(sets, r.Intake); retention > 0 && snap.At.Sub(r.StoredAt) > retention {
			r.State = StateExpired
		}
	}
	snap.expiredNamed = make(map[string]bool, len(expiredBy))
	for _, id := range expiredOrder {
		snap.expiredNamed[id] = true
		if _, present := snap.byID[id]; !present && resolvedBy[id] == nil {
			snap.Gone = append(snap.Gone, *expiredBy[id])
		}
	}
	return snap, nil
}

func retention(sets []*quarantineSet, intake string) time.Duration {
	for _, s := range sets {
		if s.cfg.Quarantine.Queue == intake {
			return s.cfg.Quarantine.Retention
		}
	}
	return 0
}

// recordReaders is how many consumers read a records stream at once.
const recordReaders = 2

func (in *Inspector) readRecords(ctx context.Context, s *quarantineSet) ([]*Record, int, error) {
	// Each part decodes on its consumer's goroutine while the broker still
	// sends: reading and decoding overlap, and the parts keep stream order.
	parts := make([][]*Record, recordReaders)
	bad := make([]int, recordReaders)
	err := readStreamParts(ctx, in.Conn, s.cfg.Quarantine.RecordsStream(), streamWaits{}, recordReaders, func(part int, off int64, d *amqp.Delivery) error {
		if r, err := recordFrom(d.Body, off, s); err == nil {
			if in.OmitBodies {
				r.dropBody()
			}
			parts[part] = append(parts[part], r)
		} else {
			bad[part]++
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	out := slices.Concat(parts...)
	n := 0
	for _, b := range bad {
		n += b
	}
	return out, n, nil
}

func recordFrom(body []byte, off int64, s *quarantineSet) (*Record, error) {
	meta, payload, err := decodeRecord(body)
	if err != nil {
		return nil, err
	}
	// The intake is the quarantine whose stream holds the record, whatever
	// its meta says (anyone who may write the stream writes the meta): a
	// replay or purge marks it in that quarantine's events stream.
	r := &Record{
		ID: meta.ID, Intake: s.cfg.Quarantine.Queue, Offset: off, StoredAt: meta.StoredAt, Properties: meta.Props,
		Exchange: meta.Exchange, RoutingKey: meta.RoutingKey, Body: payload, rawHeaders: meta.Headers,
		Redrives: meta.Redrives, version: meta.Version,
	}
	if meta.Envelope != nil {
		r.Envelope = *meta.Envelope
	} else {
		h := r.Headers()
		r.Envelope, _ = Read(&amqp.Delivery{Headers: h, MessageId: meta.Props.MessageID})
		r.Redrives = redrives(h)
		r.version = wireval.Str(h, versionHeader)
	}
	// The envelope is headers, and a message the broker dead-lettered
	// itself carries the producer's headers as sent, a forged envelope
	// included: a record only ever belongs to a work queue of this
	// quarantine. The dead-letter exchange it reached the intake through
	// (set by the broker) names it; else the envelope, if it names one of
	// them; else the quarantine's first work queue. Replay sends it there.
	r.Queue, r.Owner = ownerOf(r, s)
	// A forged negative count would buy redrives past the budget.
	r.Redrives = max(r.Redrives, 0)
	return r, nil
}

// ownerOf is the work queue of s that r belongs to, and its owner.
func ownerOf(r *Record, s *quarantineSet) (string, config.Owner) {
	owner := s.cfg
	for _, q := range s.queues {
		if q.Name == r.Envelope.OriginalQueue {
			owner = q
		}
	}
	for _, q := range s.queues {
		if r.Exchange == config.DeadExchangeName(q.Name) {
			owner = q
		}
	}
	if s.unrouted {
		owner = unroutedOwner(r, s)
	}
	return owner.Name, owner.Owner
}

// dropBody forgets r's payload and copies out the one other slice of the
// stream message it keeps (the encoded headers; the meta's strings are
// copies already), so that nothing of r holds the message's memory.
func (r *Record) dropBody() {
	r.Body, r.rawHeaders = nil, bytes.Clone(r.rawHeaders)
}

// unroutedOwner is the work queue a retry in the catch-all was for: the
// one its shared tier's expiry routed it to, which the broker's own x-death
// entry for that expiry names among its routing keys (the tier's name, then
// the CC naming the work queue), else the catch-all itself. Only the
// runtime and the broker's dead-lettering can put a message there (the
// return and unrouted exchanges are internal, and only the runtime should
// publish to the delay exchange), but the entry is read as evidence all the
// same: it only picks among the shared tiers' own queues.
func unroutedOwner(r *Record, s *quarantineSet) *config.Queue {
	h := triage.HistoryOf(r.Headers())
	for _, d := range h.Deaths {
		if d.Reason != triage.ReasonExpired {
			continue
		}
		for _, key := range d.RoutingKeys {
			for _, q := range s.queues {
				if q.Name == key {
					r.Envelope.Reason = fmt.Sprintf("a retry for %s that found no %s when it left the shared tier %s (deleted while it waited?)", q.Name, q.Name, d.Queue)
					return q
				}
			}
		}
		if d.Queue != "" {
			r.Envelope.Reason = fmt.Sprintf("a retry whose work queue was not found when it left the shared tier %s", d.Queue)
		}
		break
	}
	return s.cfg
}

// intakeDepth is how many messages wait in an intake queue (a passive
// declare: it changes nothing).
func intakeDepth(conn *amqp.Connection, intake string) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(intake, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("intake %s (was the topology applied?): %w", intake, err)
	}
	return q.Messages, nil
}

// ReadBody reads r's payload from its quarantine's records stream: the
// one message at r.Offset, which must be r's record (ErrNoRecord if the
// broker's retention removed it). It is how a reader of a snapshot taken
// with OmitBodies shows one payload: the read holds that message and no
// other. It waits for the broker until ctx ends.
func (in *Inspector) ReadBody(ctx context.Context, r *Record) ([]byte, error) {
	var stream string
	for _, s := range in.quarantines() {
		if s.cfg.Quarantine.Queue == r.Intake {
			stream = s.cfg.Quarantine.RecordsStream()
		}
	}
	if stream == "" {
		return nil, fmt.Errorf("record %s: quarantine %q is not in the config", r.ID, r.Intake)
	}
	d, err := readAt(ctx, in.Conn, stream, r.Offset)
	if err != nil {
		return nil, err
	}
	if off := streamOffset(d); off != r.Offset {
		return nil, fmt.Errorf("%w: %q (the broker's retention removed it from %s)", ErrNoRecord, r.ID, stream)
	}
	meta, payload, err := decodeRecord(d.Body)
	if err != nil || meta.ID != r.ID {
		return nil, fmt.Errorf("%w: %q (offset %d of %s holds another message)", ErrNoRecord, r.ID, r.Offset, stream)
	}
	return payload, nil
}

// readBodies sets the payload of each of recs (read without them), in one
// pass over each records stream from the lowest of their offsets to the
// highest: what it holds is their payloads, not the stream's. It returns
// those whose payload is no longer at its offset (retention removed it),
// which keep none.
func (in *Inspector) readBodies(ctx context.Context, recs []*Record) ([]*Record, error) {
	byStream := map[string]map[int64]*Record{}
	for _, s := range in.quarantines() {
		for _, r := range recs {
			if r.Intake == s.cfg.Quarantine.Queue {
				stream := s.cfg.Quarantine.RecordsStream()
				if byStream[stream] == nil {
					byStream[stream] = map[int64]*Record{}
				}
				byStream[stream][r.Offset] = r
			}
		}
	}
	found := map[*Record]bool{}
	for stream, want := range byStream {
		lo, hi := int64(math.MaxInt64), int64(-1)
		for off := range want {
			lo, hi = min(lo, off), max(hi, off)
		}
		err := consumeFrom(ctx, in.Conn, stream, lo, func(off int64, d *amqp.Delivery) error {
			if r := want[off]; r != nil {
				if meta, payload, err := decodeRecord(d.Body); err == nil && meta.ID == r.ID {
					r.Body, found[r] = payload, true
				}
			}
			if off >= hi {
				return errStopRead
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStopRead) {
			return nil, err
		}
	}
	var gone []*Record
	for _, r := range recs {
		if !found[r] {
			gone = append(gone, r)
		}
	}
	return gone, nil
}

// ErrNoRecord: no record has that id.
var ErrNoRecord = errors.New("no quarantine record with that id (record ids are the ID column of quarantine list, not message ids)")

// ErrAmbiguous: an id prefix matches more than one record.
var ErrAmbiguous = errors.New("id prefix matches more than one record")

// Get returns the record with id, or the one record whose id starts with
// id (at least 4 characters).
func (s *Snapshot) Get(id string) (*Record, error) {
	if r, ok := s.byID[id]; ok {
		return r, nil
	}
	if len(id) < 4 {
		return nil, fmt.Errorf("%w: %q", ErrNoRecord, id)
	}
	var found *Record
	for _, r := range s.Records {
		if strings.HasPrefix(r.ID, id) {
			if found != nil {
				return nil, fmt.Errorf("%w: %q", ErrAmbiguous, id)
			}
			found = r
		}
	}
	if found == nil {
		return nil, fmt.Errorf("%w: %q", ErrNoRecord, id)
	}
	return found, nil
}

// History is every record of the same message (same message id or
// idempotency key) other than r, oldest first: its earlier and later trips
// through the quarantine. A redacted key (redactedValue, the same for every
// message) links nothing: the message id does.
func (s *Snapshot) History(r *Record) []*Record {
	var out []*Record
	key := func(x *Record) string {
		if x.Envelope.IdempotencyKey != "" && x.Envelope.IdempotencyKey != redactedValue {
			return "k:" + x.Envelope.IdempotencyKey
		}
		if x.Properties.MessageID != "" {
			return "m:" + x.Properties.MessageID
		}
		return ""
	}
	k := key(r)
	if k == "" {
		return nil
	}
	for _, x := range s.Records {
		if x != r && key(x) == k {
			out = append(out, x)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].StoredAt.Before(out[j].StoredAt) })
	return out
}

// Filter selects records. Every set field must match.
type Filter struct {
	IDs         []string  `json:"ids,omitempty"`
	Queue       string    `json:"queue,omitempty"`
	Class       string    `json:"class,omitempty"`
	Reason      string    `json:"reason,omitempty"` // substring of the reason
	Fingerprint string    `json:"fingerprint,omitempty"`
	Type        string    `json:"type,omitempty"`
	Version     string    `json:"version,omitempty"`
	Since       time.Time `json:"since,omitzero"`
	Until       time.Time `json:"until,omitzero"`
	Error       string    `json:"error,omitempty"` // substring of the error
	// States defaults to open only. It is not a selector.
	States []State `json:"states,omitempty"`
}

// HasSelector reports whether f selects anything narrower than "all":
// replay and purge refuse a filter without one.
func (f Filter) HasSelector() bool {
	return len(f.IDs) > 0 || f.Queue != "" || f.Class != "" || f.Reason != "" || f.Fingerprint != "" ||
		f.Type != "" || f.Version != "" || !f.Since.IsZero() || !f.Until.IsZero() || f.Error != ""
}

func (f Filter) String() string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("ids", strings.Join(f.IDs, ","))
	add("queue", f.Queue)
	add("class", f.Class)
	add("reason", f.Reason)
	add("fingerprint", f.Fingerprint)
	add("type", f.Type)
	add("version", f.Version)
	if !f.Since.IsZero() {
		add("since", f.Since.UTC().Format(time.RFC3339))
	}
	if !f.Until.IsZero() {
		add("until", f.Until.UTC().Format(time.RFC3339))
	}
	add("error", f.Error)
	return strings.Join(parts, " ")
}

// Match reports whether r passes f.
func (f Filter) Match(r *Record) bool {
	states := f.States
	if len(states) == 0 {
		states = []State{StateOpen}
	}
	ok := false
	for _, s := range states {
		ok = ok || s == r.State
	}
	if !ok {
		return false
	}
	if len(f.IDs) > 0 {
		hit := false
		for _, id := range f.IDs {
			hit = hit || r.ID == id || (len(id) >= 4 && strings.HasPrefix(r.ID, id))
		}
		if !hit {
			return false
		}
	}
	env := &r.Envelope
	switch {
	case f.Queue != "" && r.Queue != f.Queue && r.Intake != f.Queue,
		f.Class != "" && string(env.Class) != f.Class,
		f.Reason != "" && !strings.Contains(env.Reason, f.Reason),
		f.Fingerprint != "" && !strings.HasPrefix(env.Fingerprint, f.Fingerprint),
		f.Type != "" && messageType(r) != f.Type,
		f.Version != "" && schemas.NormalizeVersion(f.Version) != schemaVersion(r),
		!f.Since.IsZero() && r.Seen().Before(f.Since),
		!f.Until.IsZero() && !r.Seen().Before(f.Until),
		f.Error != "" && !strings.Contains(env.Error, f.Error):
		return false
	}
	return true
}

func messageType(r *Record) string {
	if r.Envelope.MessageType != "" {
		return r.Envelope.MessageType
	}
	return r.Properties.Type
}

func schemaVersion(r *Record) string {
	if r.Envelope.SchemaVersion != "" {
		return r.Envelope.SchemaVersion
	}
	return r.version
}

// List returns the records f selects, in stream order.
func (s *Snapshot) List(f Filter) []*Record {
	var out []*Record
	for _, r := range s.Records {
		if f.Match(r) {
			out = append(out, r)
		}
	}
	return out
}

// goneRecords are the Gone records f selects, as records without a
// payload (for counting only).
func (s *Snapshot) goneRecords(f Filter) []*Record {
	var out []*Record
	for _, g := range s.Gone {
		r := &Record{ID: g.ID, Queue: g.Queue, State: StateExpired, Owner: g.Owner,
			Envelope: Envelope{Class: triage.Class(g.Class), Fingerprint: g.Fingerprint, QuarantinedAt: g.Seen}}
		if f.Match(r) {
			out = append(out, r)
		}
	}
	return out
}

// Group is one line of stats: records of one queue, class and
// fingerprint.
type Group struct {
	Queue       string       `json:"queue"`
	Class       string       `json:"class"`
	Fingerprint string       `json:"fingerprint"`
	Owner       config.Owner `json:"owner"`
	Open        int          `json:"open"`
	Replayed    int          `json:"replayed"`
	Purged      int          `json:"purged"`
	Expired     int          `json:"expired"`
	FirstSeen   time.Time    `json:"first_seen"`
	LastSeen    time.Time    `json:"last_seen"`
	// Example is what went wrong, for people: one record's error (its
	// reason if it has none). The class alone does not tell two groups
	// apart; the error does.
	Example string `json:"example"`
	// OldestOpenAge is the age of the oldest open record (0 if none).
	OldestOpenAge Seconds `json:"oldest_open_age_seconds"`
}

// Stats groups the records f selects (every state, unless f names
// states) by queue, class and fingerprint; the most open first.
func (s *Snapshot) Stats(f Filter) []Group {
	if len(f.States) == 0 {
		f.States = []State{StateOpen, StateReplayed, StatePurged, StateExpired}
	}
	byKey := map[[3]string]*Group{}
	var order []*Group
	for _, r := range append(s.List(f), s.goneRecords(f)...) {
		k := [3]string{r.Queue, string(r.Envelope.Class), r.Envelope.Fingerprint}
		g, ok := byKey[k]
		if !ok {
			ex := r.Envelope.Error
			if ex == "" {
				ex = r.Envelope.Reason
			}
			g = &Group{Queue: k[0], Class: k[1], Fingerprint: k[2], Owner: r.Owner, FirstSeen: r.Seen(), LastSeen: r.Seen(), Example: ex}
			byKey[k] = g
			order = append(order, g)
		}
		seen := r.Seen()
		if seen.Before(g.FirstSeen) {
			g.FirstSeen = seen
		}
		if seen.After(g.LastSeen) {
			g.LastSeen = seen
		}
		switch r.State {
		case StateOpen:
			g.Open++
			g.OldestOpenAge = max(g.OldestOpenAge, Seconds(s.At.Sub(seen)))
		case StateReplayed:
			g.Replayed++
		case StatePurged:
			g.Purged++
		case StateExpired:
			g.Expired++
		}
	}
	sort.SliceStable(order, func(i, j int) bool {
		if order[i].Open != order[j].Open {
			return order[i].Open > order[j].Open
		}
		return order[i].OldestOpenAge > order[j].OldestOpenAge
	})
	out := make([]Group, len(order))
	for i, g := range order {
		out[i] = *g
	}
	return out
}

// OldestOpenAge is the age of the oldest open record of queue ("" for
// every queue), 0 if none is open.
func (s *Snapshot) OldestOpenAge(queue string) time.Duration {
	var oldest time.Duration
	for _, r := range s.Records {
		if r.State == StateOpen && (queue == "" || r.Queue == queue) {
			oldest = max(oldest, s.At.Sub(r.Seen()))
		}
	}
	return oldest
}
