// Package publisher sends messages that are valid by construction: each one
// is checked against the schema registry before it leaves the process, and
// is confirmed by the broker (publisher confirms with mandatory set) before
// Publish returns.
package publisher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/wire"
)

// contentType is the content type of every message sent.
const contentType = "application/json"

// Errors Publish returns; match them with errors.Is. On any error the message
// must be treated as not sent.
var (
	// ErrUnroutable: no queue took the message. The broker returned it
	// (basic.return, as the publisher sets mandatory); it still acks such a
	// message, so without mandatory it would have vanished silently.
	ErrUnroutable = amqpx.ErrUnroutable
	// ErrNacked: the broker refused the message (basic.nack), e.g. a full
	// queue with x-overflow=reject-publish.
	ErrNacked = amqpx.ErrNacked
	// ErrClosed: Close was called, or the channel or connection closed
	// under the publish. After a closed channel the next Publish opens a new
	// one; after Close, or once a connection given to New is closed, every
	// Publish fails (a Publisher from Connect connects again instead).
	ErrClosed = amqpx.ErrPublisherClosed
	// ErrCloseAbandoned: Close gave up waiting for the broker's close-ok
	// (a resource alarm blocks the connection); the close completes when
	// the alarm clears or the connection is closed.
	ErrCloseAbandoned = amqpx.ErrCloseAbandoned
)

// Config configures a Publisher.
type Config struct {
	// Registry holds the schemas messages are validated against. Required.
	Registry *schemas.Registry
	// Identity says how consumers find a message's type and version; use the
	// target queue's. With FromProperties the publisher names them in the
	// AMQP type property and the version header; with FromEnvelope or
	// FromPointer the body names them (the properties are set as well).
	// Defaults to the AMQP type property plus the "schema-version" header.
	Identity schemas.Identity
	// AppID is the AMQP app-id property. Defaults to "" (unset).
	AppID string
	// MaxBodyBytes refuses larger bodies, as the consumer's gate would.
	// Defaults to 1 MiB; -1 means no limit.
	MaxBodyBytes int
	// Logger hears which node a Publisher made by Connect connects to, and
	// each node it could not reach. Defaults to slog.Default().
	Logger *slog.Logger
}

// Message is one message to publish.
type Message struct {
	// Type and Version name the schema. Required with FromProperties; with
	// FromEnvelope or FromPointer they are read from the body and, if set
	// here too, must agree with it.
	Type, Version string
	// Body is the JSON body.
	Body []byte
	// MessageID defaults to a random UUID.
	MessageID string
	// IdempotencyKey defaults to MessageID.
	IdempotencyKey string
	// CorrelationID is optional.
	CorrelationID string
	// Headers are extra AMQP headers. The version header, the idempotency
	// key and the trace context are set by the publisher and win.
	Headers map[string]any
}

// Publisher validates and publishes messages. Safe for concurrent use:
// validation runs concurrently, publishes are serialized on one confirm-mode
// channel, which is reopened after a failure that closed it.
type Publisher struct {
	gate *schemas.Gate
	id   schemas.Identity
	cfg  Config
	// dialer and name are Connect's: with them the Publisher owns conn and
	// dials it again when it is lost. nil for New.
	dialer *amqpx.Dialer
	name   string

	mu     sync.Mutex
	conn   *amqp.Connection
	node   amqpx.Node       // conn's, with a dialer
	pub    *amqpx.Publisher // nil once broken; reopened on the next Publish
	closed bool

	closeOnce sync.Once
	closing   chan struct{} // closed by Close: ends a channel open in progress
}

// New opens a confirm-mode channel on conn, which the caller owns: once it
// is closed, every Publish fails. Connect makes a Publisher that connects
// again by itself.
func New(conn *amqp.Connection, cfg Config) (*Publisher, error) {
	if conn == nil {
		return nil, errors.New("publisher: connection is required")
	}
	p, err := newPublisher(cfg)
	if err != nil {
		return nil, err
	}
	pub, err := amqpx.NewPublisher(conn)
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	p.conn, p.pub = conn, pub
	return p, nil
}

// Connect connects to the broker at url (one AMQP URL, or the URLs of
// several nodes of one cluster, comma separated, all with the same vhost)
// with connection name name, and returns a Publisher that owns the
// connection. It tries the nodes in turn and logs which one it reached
// (Config.Logger). When the connection is lost, the publish in flight
// fails (treat it as not sent: it was not confirmed) and the next Publish
// connects again, starting at the node after the lost one, for up to three
// rounds over the list with a jittered pause between them, or until its
// context ends; if no node answers, that Publish fails and the one after
// tries again. Close closes the connection too.
func Connect(ctx context.Context, url, name string, cfg Config) (*Publisher, error) {
	d, err := amqpx.NewDialer(url)
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	p, err := newPublisher(cfg)
	if err != nil {
		return nil, err
	}
	d.Logger = p.cfg.Logger.With("component", "dlxbridge.publisher")
	p.dialer, p.name = d, name
	conn, node, err := d.DialRetry(ctx, name, amqpx.Retry{})
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	pub, err := amqpx.NewPublisherContext(ctx, conn)
	if err != nil {
		_ = amqpx.CloseConnection(conn, amqpx.CloseTimeout)
		return nil, fmt.Errorf("publisher: %w", err)
	}
	p.conn, p.node, p.pub = conn, node, pub
	return p, nil
}

// newPublisher is what New and Connect share: the config checked, the
// gate built.
func newPublisher(cfg Config) (*Publisher, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		return nil, errors.New("publisher: Config.Registry is required")
	}
	id := cfg.Identity
	if id.From == "" {
		id.From = schemas.FromProperties
	}
	if id.VersionHeader == "" {
		id.VersionHeader = wire.DefaultVersionHeader
	}
	gate, err := schemas.NewGate(schemas.GateConfig{Registry: cfg.Registry, Identity: id, MaxBodyBytes: cfg.MaxBodyBytes})
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	return &Publisher{gate: gate, id: id, cfg: cfg, closing: make(chan struct{})}, nil
}

// Publish validates m and, if it is valid, publishes it to exchange with
// routing key and waits for the broker's confirm. An invalid message is
// refused with its *schemas.ValidationError and never sent. A message no
// queue took returns an error wrapping ErrUnroutable; a nack returns
// ErrNacked. On any error the message must be treated as not sent.
func (p *Publisher) Publish(ctx context.Context, exchange, routingKey string, m Message) error {
	msg, err := p.prepare(ctx, m)
	if err != nil {
		return err
	}
	pub, err := p.channel(ctx)
	if err != nil {
		return err
	}
	err = pub.Publish(ctx, exchange, routingKey, msg)
	if err != nil && !errors.Is(err, amqpx.ErrUnroutable) && !errors.Is(err, amqpx.ErrNacked) {
		p.retire(pub)
	}
	return err
}

// prepare validates m and builds the AMQP message.
func (p *Publisher) prepare(ctx context.Context, m Message) (amqp.Publishing, error) {
	headers := amqp.Table{}
	for k, v := range m.Headers {
		headers[k] = v
	}
	in := schemas.Input{ContentType: contentType, Type: m.Type, Headers: map[string]any{}, Body: m.Body}
	if m.Version != "" {
		in.Headers[p.id.VersionHeader] = m.Version
	}
	valid, err := p.gate.Check(in)
	if err != nil {
		return amqp.Publishing{}, err
	}
	if p.id.From != schemas.FromProperties {
		if m.Type != "" && m.Type != valid.Type || m.Version != "" && schemas.NormalizeVersion(m.Version) != valid.Version {
			return amqp.Publishing{}, fmt.Errorf("publisher: message says %s v%s but its body says %s v%s", m.Type, m.Version, valid.Type, valid.Version)
		}
	}
	id := m.MessageID
	if id == "" {
		id = newUUID()
	}
	key := m.IdempotencyKey
	if key == "" {
		key = id
	}
	headers[p.id.VersionHeader] = valid.Version
	headers[wire.HeaderIdempotencyKey] = key
	telemetry.Inject(ctx, headers)
	if err := headers.Validate(); err != nil {
		return amqp.Publishing{}, fmt.Errorf("publisher: headers: %w", err)
	}
	return amqp.Publishing{
		Headers:       headers,
		ContentType:   contentType,
		DeliveryMode:  amqp.Persistent,
		CorrelationId: m.CorrelationID,
		MessageId:     id,
		Timestamp:     time.Now().UTC(),
		Type:          valid.Type,
		AppId:         p.cfg.AppID,
		Body:          m.Body,
	}, nil
}

// channel returns the live publisher, reopening it if a failure closed it,
// and, for a Publisher from Connect, connecting again if the connection is
// gone. The reopen waits at most until ctx ends or Close is called: the
// broker answers no channel open on a connection it has blocked (resource
// alarm).
func (p *Publisher) channel(ctx context.Context) (*amqpx.Publisher, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, amqpx.ErrPublisherClosed
	}
	lost := p.conn.IsClosed()
	if p.pub != nil && !lost {
		return p.pub, nil
	}
	if p.pub != nil { // its connection is gone: it can only fail
		_ = p.pub.Close()
		p.pub = nil
	}
	if lost && p.dialer == nil {
		return nil, fmt.Errorf("publisher: %w: connection closed", amqpx.ErrPublisherClosed)
	}
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.closing:
			cancel()
		case <-octx.Done():
		}
	}()
	if lost {
		p.dialer.Lost(p.node)
		conn, node, err := p.dialer.DialRetry(octx, p.name, amqpx.Retry{})
		if err != nil {
			return nil, fmt.Errorf("publisher: connect again: %w", err)
		}
		p.conn, p.node = conn, node
	}
	pub, err := amqpx.NewPublisherContext(octx, p.conn)
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	p.pub = pub
	return pub, nil
}

// retire drops pub after a failure that closed its channel, unless another
// goroutine already replaced it.
func (p *Publisher) retire(pub *amqpx.Publisher) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pub == pub {
		_ = pub.Close()
		p.pub = nil
	}
}

// Close closes the channel, and the connection if Connect opened it (a
// connection given to New is the caller's). Publish fails afterwards
// with ErrClosed, and a publish waiting for its confirm ends with it (treat
// that message as not sent). Close waits at most a second for the broker
// (and a second more for a connection of its own, whose socket it closes
// then): during a resource alarm the broker answers nothing on a
// publishing connection, so the close is then abandoned (an error wrapping
// ErrCloseAbandoned) and completes when the alarm clears or the connection
// is closed.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() { close(p.closing) })
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var err error
	if p.pub != nil {
		err = p.pub.Close()
		p.pub = nil
	}
	if p.dialer != nil {
		err = errors.Join(err, amqpx.CloseConnection(p.conn, amqpx.CloseTimeout))
	}
	return err
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}
