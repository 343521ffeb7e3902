// Package consumer is dlxbridge's runtime: it consumes work queues, runs every
// delivery through the crash-loop guard and the schema gate (in the queue's
// mode: enforce, report or off) before any handler sees it, and carries out
// triage's verdicts: ack, a delayed retry through the TTL retry lanes, or
// quarantine with a failure envelope. Config.OnSettled tells the host program
// each outcome.
//
// Nothing is acked before it is safe elsewhere: a retry or quarantine publish
// is confirmed by the broker (with mandatory set) before the original is
// acked. The confirm is not waited for in line: a worker goes on with its
// next deliveries while up to 64 of its publishes await their confirms, and
// acks are coalesced over the delivery tags already settled. If that
// publish fails the original is rejected with requeue, so the broker
// redelivers it and the crash-loop guard (or the broker's delivery limit,
// which dead-letters to the quarantine) bounds the loop.
//
// A delivery passes the stages in this order, a file each: receive.go (the
// feeder), worker.go (the checks), invoke.go (the handler), settle.go (the
// one settle step, fed an outcome value: it builds a failure's copy with the
// pure builders of build.go), publish.go (the copy's publish and confirm,
// and the requeue when it fails), acks.go (the ack or reject, and the
// outcome recorded once).
// outcome.go holds the values it reports.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Config configures a Consumer.
type Config struct {
	// URL is the AMQP URL, or the URLs of several nodes of one cluster,
	// comma separated ("amqp://u:p@n1:5672/,amqp://u:p@n2:5672/"; every
	// one with the same vhost). Each connect tries the nodes in turn,
	// starting after the node whose connection was lost, and logs which
	// node it reached. Required.
	URL string
	// File is the configuration: from config.Load, or built in code and
	// finished with its Complete method. Required.
	File *config.Config
	// Registry is the compiled schema registry. Required, unless every
	// queue's gate is off.
	Registry *schemas.Registry
	// ConnectionName names the connection on the broker. Defaults to
	// File.Broker.ConnectionName + "/consumer".
	ConnectionName string
	// Logger receives the runtime's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the runtime's Prometheus collectors, the
	// quarantine's among them (quarantine.NewMetrics, refreshed as
	// QuarantineMetrics says). Defaults to nil: metrics are kept but not
	// registered anywhere, and the runtime does not read the quarantine.
	Registerer prometheus.Registerer
	// TracerProvider makes the runtime's spans. Defaults to the global
	// provider (otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
	// WorkerVersion is recorded in quarantine envelopes. Defaults to the
	// main module's version from the build info.
	WorkerVersion string
	// DrainTimeout bounds graceful shutdown: after the context ends, the
	// consumers are cancelled and the workers get this long to handle what
	// was already delivered (handlers in flight and the prefetch) before the
	// channels are closed. The broker requeues what is then unacked, which
	// counts toward the delivery limit. Defaults to 30s.
	DrainTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the exponential backoff between
	// reconnects. Default to 100ms and 30s.
	ReconnectMin, ReconnectMax time.Duration
	// PermanentFailureTimeout bounds how long Run keeps retrying a failure
	// that does not pass by itself: the broker refusing the login (wrong
	// user name or password), refusing access to the vhost or a queue, or a
	// work queue that does not exist. Run tries again with the usual
	// backoff, never sleeping past this long, and returns the error once
	// such failures in a row have lasted this long (and at least two tries
	// were made). Any other failure in between (the broker unreachable, a
	// connection reset) starts the count again. Defaults to 10s; -1 retries
	// forever.
	PermanentFailureTimeout time.Duration
	// Rand draws retry jitter, a float in [0, 1). Workers call it
	// concurrently, so it must be safe for concurrent use. Defaults to
	// math/rand/v2's Float64.
	Rand func() float64
	// Now is the clock; called concurrently. Defaults to time.Now.
	Now func() time.Time
	// SigningKey signs the retry headers (see triage.Signer); every
	// consumer of a queue needs the same one. At least triage.MinKeyBytes.
	// Defaults to the value of the environment variable named by
	// File.Security.SigningKeyEnv, else a random per-process key (with a
	// warning: a restart then resets the budgets of retries in flight).
	SigningKey []byte
	// OnSettled, if set, is told every delivery's outcome (see Settled)
	// once the runtime has settled it: after the ack, after the reject with
	// requeue, or when the session's end left it to the broker
	// (OutcomeAbandoned). Deliveries the client had received but the
	// runtime had not taken up yet at the end (the rest of the prefetch)
	// are not reported: the broker requeues them too.
	// Acks are coalesced and retry or quarantine publishes pipelined, so it
	// runs once the ack is written (at the latest when a worker waits for
	// its next delivery) or the confirm is in, on a goroutine of the
	// runtime's, several at once: keep it fast and safe for concurrent use
	// (count, or hand off to a buffered channel without blocking). A panic
	// in it is recovered and logged. Defaults to nil.
	OnSettled func(Settled)
	// QuarantineMetrics is refreshed from the quarantine streams of File's
	// queues every QuarantineRefresh while the runtime is connected, over
	// its consuming connection; each refresh also writes an expired event
	// for the records newly past their retention, so that they stay counted
	// after the broker deletes them. Set it only to share one
	// quarantine.Metrics with another reader of the quarantine (a page
	// that observes it too); New then registers none of its own. Defaults
	// to quarantine.NewMetrics(Registerer) when Registerer is set, else
	// nil: the runtime does not read the quarantine.
	QuarantineMetrics *quarantine.Metrics
	// QuarantineRefresh is how often QuarantineMetrics is refreshed (each
	// refresh reads every record; the oldest record's age grows at each
	// scrape regardless). Defaults to 30s.
	QuarantineRefresh time.Duration

	// KeepQuarantineIntake, if true, leaves what arrives in each quarantine
	// queue there instead of moving it into the quarantine's records stream
	// (see docs/quarantine.md), for a tool that reads the quarantine queue
	// itself. `dlxbridge quarantine` then sees none of it. Defaults to false.
	KeepQuarantineIntake bool

	// Test hooks, nil in production.
	hooks *testHooks
}

func (c *Config) validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("consumer.Config.URL is required"))
	} else if _, err := amqpx.ParseURLList(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("consumer.Config.URL: %w", err)) // quotes nothing of the URL
	}
	if c.File == nil {
		errs = append(errs, errors.New("consumer.Config.File is required"))
	} else if err := c.File.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("consumer.Config.File: %w", err))
	}
	if c.Registry == nil && gated(c.File) {
		errs = append(errs, errors.New("consumer.Config.Registry is required (unless every queue's gate is off)"))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, errors.New("consumer.Config.DrainTimeout must be >= 0"))
	}
	if c.ReconnectMin < 0 || c.ReconnectMax < 0 || (c.ReconnectMax > 0 && c.ReconnectMin > c.ReconnectMax) {
		errs = append(errs, errors.New("consumer.Config.ReconnectMin/Max must be >= 0 and Min <= Max"))
	}
	if c.QuarantineRefresh < 0 {
		errs = append(errs, errors.New("consumer.Config.QuarantineRefresh must be >= 0"))
	}
	if c.PermanentFailureTimeout < -1 {
		errs = append(errs, errors.New("consumer.Config.PermanentFailureTimeout must be >= 0, or -1 to retry forever"))
	}
	return errors.Join(errs...)
}

func (c *Config) withDefaults() *Config {
	out := *c
	if out.ConnectionName == "" {
		out.ConnectionName = out.File.Broker.ConnectionName + "/consumer"
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.TracerProvider == nil {
		out.TracerProvider = otel.GetTracerProvider()
	}
	if out.WorkerVersion == "" {
		out.WorkerVersion = "devel"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
			out.WorkerVersion = bi.Main.Version
		}
	}
	if out.DrainTimeout == 0 {
		out.DrainTimeout = 30 * time.Second
	}
	if out.ReconnectMin == 0 {
		out.ReconnectMin = 100 * time.Millisecond
	}
	if out.ReconnectMax == 0 {
		out.ReconnectMax = 30 * time.Second
	}
	if out.QuarantineRefresh == 0 {
		out.QuarantineRefresh = 30 * time.Second
	}
	if out.PermanentFailureTimeout == 0 {
		out.PermanentFailureTimeout = 10 * time.Second
	}
	if out.Rand == nil {
		out.Rand = rand.Float64
	}
	if out.Now == nil {
		out.Now = time.Now
	}
	return &out
}

// deps are the runtime's dependencies, built once in New and shared by
// pointer: every queue, session and worker reads them here rather than
// through its owner.
type deps struct {
	cfg     *Config // defaults applied; cfg.hooks are the test hooks
	log     *slog.Logger
	tracer  trace.Tracer
	metrics *metrics
	host    string
	signer  *triage.Signer
	// verifier is the quarantine keeper's (see keeperVerifier).
	verifier *triage.Signer
	// dialer connects to the nodes of cfg.URL.
	dialer *amqpx.Dialer
	// jobs records what became of replayed messages (nil without a
	// configured key); redrive carries out automatic redrive (nil when no
	// queue has it on). See autoredrive.go.
	jobs    *jobRecorder
	redrive *redriver
}

// Consumer runs handlers for the configured work queues.
type Consumer struct {
	*deps

	mu      sync.Mutex
	routers map[string]*router // by queue
	running bool
	queues  map[string]*queueRuntime

	ready atomic.Bool // see Ready
	// node is the node the current session is connected to; nil between
	// sessions (see Node).
	node atomic.Pointer[amqpx.Node]
}

// New checks cfg and returns a Consumer. Register handlers, then call Run.
func New(cfg *Config) (*Consumer, error) {
	if cfg == nil {
		return nil, errors.New("consumer.New: nil Config")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	if cfg.QuarantineMetrics == nil && cfg.Registerer != nil {
		if cfg.QuarantineMetrics, err = quarantine.NewMetrics(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("register quarantine metrics: %w", err)
		}
	}
	host, _ := os.Hostname()
	signer, random, err := newSigner(cfg)
	if err != nil {
		return nil, err
	}
	dialer, err := amqpx.NewDialer(cfg.URL) // validate parsed it
	if err != nil {
		return nil, err
	}
	c := &Consumer{
		deps: &deps{
			cfg:      cfg,
			log:      slog.New(&deferAttrs{h: cfg.Logger.With("component", "dlxbridge.consumer").Handler()}),
			tracer:   cfg.TracerProvider.Tracer("github.com/dlxbridge/dlxbridge/consumer"),
			metrics:  m,
			host:     host,
			signer:   signer,
			verifier: keeperVerifier(signer, random),
			dialer:   dialer,
		},
		routers: map[string]*router{},
		queues:  map[string]*queueRuntime{},
	}
	dialer.Logger = c.log
	for i := range cfg.File.Queues {
		q := &cfg.File.Queues[i]
		qr, err := newQueueRuntime(c.deps, q)
		if err != nil {
			return nil, err
		}
		c.queues[q.Name] = qr
		c.routers[q.Name] = newRouter()
	}
	c.deps.jobs = newJobRecorder(c.deps.verifier)
	c.deps.redrive = newRedriver(c.deps, c.deps.jobs, c.queues)
	return c, nil
}

// Handle registers h for every accepted version of msgType on queue. With
// the queue's gate off, msgType may be any type. msgType "" registers the
// queue's default handler: it gets every message that no handler of its type
// or version takes, such as one whose type the gate could not read (gate in
// report mode) or one without a type property (gate off). A message no
// handler takes is quarantined as a permanent failure.
func (c *Consumer) Handle(queue, msgType string, h Handler) error {
	return c.register(queue, msgType, "", h)
}

// HandleVersion registers h for one version of msgType on queue. Older
// versions reach it through upcasters registered with Upcast.
func (c *Consumer) HandleVersion(queue, msgType, version string, h Handler) error {
	if version == "" || msgType == "" {
		return errors.New("HandleVersion: type and version are required")
	}
	return c.register(queue, msgType, schemas.NormalizeVersion(version), h)
}

// Upcast registers fn to turn msgType data of version from into version to
// for every queue whose gate is on. The upcast result is validated against
// the target version's schema before the handler sees it (unless the
// message failed a gate in report mode: see Message.GateError).
func (c *Consumer) Upcast(msgType, from, to string, fn UpcastFunc) error {
	from, to = schemas.NormalizeVersion(from), schemas.NormalizeVersion(to)
	if fn == nil || from == to {
		return fmt.Errorf("Upcast %s v%s→v%s: need a function between two different versions", msgType, from, to)
	}
	if c.cfg.Registry == nil {
		return fmt.Errorf("Upcast %s: needs Config.Registry", msgType)
	}
	if _, ok := c.cfg.Registry.Lookup(msgType, to); !ok {
		return fmt.Errorf("Upcast %s: no schema for target version %s", msgType, to)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return errors.New("Upcast after Run")
	}
	for name, r := range c.routers {
		if c.queues[name].cfg.Gate == config.GateOff {
			continue // no decoded data to upcast
		}
		r.upcasts[upcastKey{msgType, from}] = upcaster{to: to, fn: fn}
	}
	return nil
}

func (c *Consumer) register(queue, msgType, version string, h Handler) error {
	if h == nil {
		return errors.New("nil handler")
	}
	q, ok := c.cfg.File.QueueByName(queue)
	if !ok {
		return fmt.Errorf("queue %q is not in the config", queue)
	}
	if !takes(q, msgType, version) {
		if version == "" {
			return fmt.Errorf("queue %q does not accept type %q (see accepts in the config)", queue, msgType)
		}
		return fmt.Errorf("queue %q does not accept %s v%s (see accepts in the config)", queue, msgType, version)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return errors.New("handlers must be registered before Run")
	}
	r := c.routers[queue]
	if version == "" {
		if _, dup := r.byType[msgType]; dup {
			return fmt.Errorf("a handler for %q on %q is already registered", msgType, queue)
		}
		r.byType[msgType] = h
		return nil
	}
	if _, dup := r.byVersion[routeKey{msgType, version}]; dup {
		return fmt.Errorf("a handler for %s v%s on %q is already registered", msgType, version, queue)
	}
	r.byVersion[routeKey{msgType, version}] = h
	return nil
}

// Run consumes every queue that has a handler until ctx ends, reconnecting
// with backoff after connection or channel loss. When ctx ends it cancels
// the consumers, handles what was already delivered within DrainTimeout and
// returns nil: within DrainTimeout and a few seconds (each close after it
// waits at most a second for the broker), even while a resource alarm keeps
// the broker from answering. It returns an error if it can't
// start (no handlers), or when a failure that does not pass by itself (a
// refused login or vhost, a missing queue) has lasted
// PermanentFailureTimeout. No error or log line holds the URL's password.
func (c *Consumer) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return errors.New("consumer is already running")
	}
	c.running = true
	var active []*queueRuntime
	for name, qr := range c.queues {
		if !c.routers[name].empty() {
			qr.router = c.routers[name]
			active = append(active, qr)
		}
	}
	c.mu.Unlock()
	if len(active) == 0 {
		return errors.New("no handlers registered")
	}
	backoff := c.cfg.ReconnectMin
	// A run of permanent failures: how many, and when the first began.
	var refusals int
	var refusedSince time.Time
	for {
		started := time.Now()
		err := c.session(ctx, active)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(started) > c.cfg.ReconnectMax {
			backoff = c.cfg.ReconnectMin // it ran a good while: start over
		}
		wait := amqpx.Jitter(backoff, c.cfg.Rand())
		if amqpx.IsPermanent(err) {
			if refusals == 0 {
				refusedSince = started
			}
			refusals++
			elapsed := time.Since(refusedSince)
			if limit := c.cfg.PermanentFailureTimeout; limit >= 0 {
				if refusals >= 2 && elapsed >= limit {
					return fmt.Errorf("giving up after %d tries in %s: %w", refusals, elapsed.Round(time.Millisecond), err)
				}
				// The last try is made at the limit, not skipped because
				// the next backoff would sleep past it.
				wait = min(wait, max(limit-elapsed, 0))
			}
			c.log.Warn("refused by the broker; retrying", "error", err, "in", wait.String(), "try", refusals, "gives_up_after", c.cfg.PermanentFailureTimeout.String())
		} else {
			refusals = 0
			c.log.Warn("connection lost; reconnecting", "error", err, "in", wait.String())
		}
		c.metrics.reconnects.Inc()
		if h := c.cfg.hooks; h != nil && h.reconnecting != nil {
			h.reconnecting(err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(backoff*2, c.cfg.ReconnectMax)
	}
}
