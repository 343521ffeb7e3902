// Package config loads and validates dlxbridge's config.yaml.
//
// It knows the file format, its defaults and the rules of its own (names,
// the broker's limits), and nothing about AMQP. The domain's rules are the
// domain packages': Validate reports triage.Policy's, triage.BreakerPolicy's
// and schemas.Identity's problems under the file's field paths instead of
// restating them. Components (topology, consumer) build their own models
// from a validated *Config.
//
// Load never returns a half-valid config: either every problem is reported
// (one FieldError per problem, each naming the field's path such as
// "queues[1].retry.tiers[0]"), or the returned config has all defaults applied
// and passes Validate. A Config built in code gets the same defaults and
// checks from Complete.
package config

import (
	"time"

	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Config is the whole file.
type Config struct {
	// Broker holds what dlxbridge needs to reach the broker besides the AMQP
	// URL. The AMQP URL (with its password) never lives in this file: it comes
	// from --url or RABBITMQ_URL, which may list the nodes of a cluster,
	// comma separated.
	Broker Broker `yaml:"broker"`

	// Schemas configures the registry and the validation gate.
	Schemas Schemas `yaml:"schemas"`

	// Queues lists the work queues dlxbridge manages. At least one is required.
	Queues []Queue `yaml:"queues"`

	// Security says where the consumers' shared signing key comes from.
	Security Security `yaml:"security"`

	// SharedTiers names the vhost's shared delay tiers, which the queues
	// with retry.tier_queues "shared" retry through (docs/topology.md,
	// "Shared delay tiers").
	SharedTiers SharedTiers `yaml:"shared_tiers"`

	// Run configures `dlxbridge run`, the sidecar (docs/sidecar.md).
	Run Run `yaml:"run"`
}

// Security configures how the bridge vouches for its own headers.
type Security struct {
	// SigningKeyEnv names the environment variable that holds the key the
	// consumers sign their retry headers with (HMAC-SHA256; at least 16
	// bytes, best 32 random bytes). A retry header counts only with a valid
	// signature, so a producer can't forge attempts; every consumer of a
	// queue needs the same key. The key itself never lives in this file.
	// If the variable is unset or empty, each process signs with a random
	// key of its own (and logs a warning): after a restart, or on another
	// consumer process, retries in flight start their attempt count and
	// time budget over. Defaults to "DLXBRIDGE_SIGNING_KEY".
	SigningKeyEnv string `yaml:"signing_key_env"`
}

// Broker describes broker access beyond AMQP.
type Broker struct {
	// ManagementURL is the base URL of the management HTTP API, e.g.
	// "http://127.0.0.1:15672", or one per node of a cluster, comma
	// separated ("http://n1:15672,http://n2:15672"): each request goes to
	// the one that last answered, else to the next. With it, verify also
	// checks bindings, actual queue arguments and effective policies, which
	// AMQP cannot read back. Credentials are taken from the AMQP URL unless
	// given here as userinfo (the same on every URL). Defaults to ""
	// (management checks are skipped and reported as such).
	ManagementURL string `yaml:"management_url"`

	// ConnectionName is the client-provided connection name shown in the
	// management UI. Defaults to "dlxbridge".
	ConnectionName string `yaml:"connection_name"`

	// Replicas is how many cluster nodes each queue dlxbridge declares is
	// replicated on: x-quorum-initial-group-size on the work queues, retry
	// lanes and quarantine intakes, x-initial-cluster-size on the
	// quarantine streams. The broker reads it only when it creates a
	// queue, so an existing queue keeps the members it has (topology plan
	// shows it as kept, verify as a note). Must be >= 1. Defaults to 0:
	// the argument is not sent and the broker chooses.
	Replicas int `yaml:"replicas"`
}

// Schemas configures the schema registry.
type Schemas struct {
	// Dir is an extra directory of schemas laid out like the repository's
	// schemas/ folder (<type>/v<version>.json). Its files are added to the
	// embedded registry and win over embedded files of the same type and
	// version. Defaults to "" (embedded registry only).
	Dir string `yaml:"dir"`

	// MaxBodyBytes is the largest body the gate decodes; a larger one is a
	// schema failure. Defaults to 1 MiB (1048576).
	MaxBodyBytes int `yaml:"max_body_bytes"`
}

// Queue is one work queue and everything around it.
type Queue struct {
	// Name of the work queue (a quorum queue). Required.
	Name string `yaml:"name"`

	// Exchange the work queue is bound to. Required.
	Exchange Exchange `yaml:"exchange"`

	// Bindings are the routing keys (binding keys) that bind the work queue to
	// Exchange. Defaults to [Name] ("" for a fanout/headers exchange).
	Bindings []string `yaml:"bindings"`

	// DeliveryLimit is the quorum queue's x-delivery-limit: how many times the
	// broker redelivers a message that was requeued (nack/reject with requeue,
	// or a lost channel/connection) before it dead-letters it with reason
	// delivery_limit to the queue's quarantine. It is the backstop for
	// messages that crash or hang the worker. Must be >= 1. Defaults to 5.
	DeliveryLimit int `yaml:"delivery_limit"`

	// MaxLength caps the work queue (x-max-length) with x-overflow
	// reject-publish, so a full queue refuses publishes instead of dropping.
	// It needs per-queue retry lanes (Retry.TierQueues): the retries a full
	// queue refuses would hold back every queue's in a shared tier.
	// Defaults to 0 (no cap).
	MaxLength int `yaml:"max_length"`

	// Consumer settings for the runtime.
	Consumer Consumer `yaml:"consumer"`

	// Retry is the delayed-retry policy.
	Retry Retry `yaml:"retry"`

	// Quarantine is where messages that cannot succeed are parked.
	Quarantine Quarantine `yaml:"quarantine"`

	// Message says how a message names its type and version.
	Message MessageIdentity `yaml:"message"`

	// Accepts lists the message types (and their schema versions) this queue
	// takes. A message of any other type or version is a schema failure.
	// At least one is required, unless Gate is "off".
	Accepts []Accept `yaml:"accepts"`

	// Gate is the schema gate's mode for this queue: "enforce" quarantines a
	// message that fails the gate (class schema) before any handler sees it;
	// "report" validates every message, counts and logs each failure with
	// its reason, and hands the message to its handler anyway; "off" runs no
	// gate: no schema and no Accepts are needed, and handlers get the body as
	// received. The crash-loop guard runs in every mode. Defaults to
	// "enforce".
	Gate string `yaml:"gate"`

	// Owner says whom to page about this queue's quarantine; it is in every
	// quarantine record and in `quarantine stats`. Defaults to none.
	Owner Owner `yaml:"owner"`

	// Breaker configures the queue's circuit breaker (docs/breaker.md). The
	// runtime does not act on it yet: it is validated and documented only.
	Breaker Breaker `yaml:"breaker"`

	// Forward is where `dlxbridge run` sends this queue's validated
	// messages (docs/sidecar.md).
	Forward Forward `yaml:"forward"`
}

// Owner is the team responsible for a queue.
type Owner struct {
	// Team, e.g. "payments". Defaults to "".
	Team string `yaml:"team" json:"team"`
	// Contact, e.g. "#payments-oncall" or an e-mail address. Defaults to "".
	Contact string `yaml:"contact" json:"contact"`
}

// Schema gate modes (Queue.Gate).
const (
	// GateEnforce refuses (quarantines) what fails the gate.
	GateEnforce = "enforce"
	// GateReport validates, counts and logs, and delivers anyway.
	GateReport = "report"
	// GateOff skips the gate.
	GateOff = "off"
)

// Exchange is the exchange a work queue is bound to.
type Exchange struct {
	// Name of the exchange. Required; the default exchange ("") can't be
	// declared or bound.
	Name string `yaml:"name"`
	// Type is direct, topic, fanout or headers. Defaults to "topic".
	Type string `yaml:"type"`
}

// Consumer settings.
type Consumer struct {
	// Prefetch is the channel's per-consumer QoS (quorum queues refuse global
	// QoS). Defaults to 20.
	Prefetch int `yaml:"prefetch"`
	// Concurrency is how many handlers run at once for this queue. Defaults
	// to 4.
	Concurrency int `yaml:"concurrency"`
	// HandlerTimeout bounds one handler call; running out is a transient
	// failure. Defaults to 30s.
	HandlerTimeout time.Duration `yaml:"handler_timeout"`
	// CrashLoopDeliveries is how many deliveries of the same message by
	// this queue (read from the broker's x-delivery-count; a first delivery
	// never counts, even one that arrives with a count from an upstream
	// queue) the bridge allows before it quarantines the message as
	// crash-looping without calling the handler again. Must be <=
	// DeliveryLimit so the bridge acts before the broker's backstop. Defaults
	// to DeliveryLimit-1, at least 1.
	CrashLoopDeliveries int `yaml:"crash_loop_deliveries"`
}

// Retry is the delayed-retry policy of one queue.
type Retry struct {
	// Tiers are the retry delays, in order: attempt n waits Tiers[n-1]; later
	// attempts reuse the last tier. Each is one TTL queue group on the
	// broker. Must be > 0 and increasing. Defaults to [1s, 5s, 30s, 2m].
	Tiers []time.Duration `yaml:"tiers"`
	// Jitter spreads each delay over [d, d*(1+Jitter)] so a burst of failures
	// does not come back as one herd. 0 disables it. Must be in [0, 1].
	// Defaults to 0.2.
	Jitter *float64 `yaml:"jitter"`
	// Lanes is how many TTL queues each tier is split into to carry the
	// jitter (messages expire only at the head of a queue, so one queue can't
	// hold mixed delays). Must be in [1, 16]. Defaults to 4 (1 if Jitter is 0).
	Lanes int `yaml:"lanes"`
	// MaxAttempts is the total number of handler attempts, the first
	// delivery included. Must be >= 1. Defaults to 5.
	MaxAttempts int `yaml:"max_attempts"`
	// MaxElapsed bounds the time from the first failure to the last retry;
	// a retry that would return after it quarantines instead. 0 disables the
	// time budget. Defaults to 15m.
	MaxElapsed *time.Duration `yaml:"max_elapsed"`
	// TierQueues says where this queue's delayed retries wait. "shared":
	// in the vhost's shared delay tiers, one TTL queue per distinct lane
	// delay whatever the number of work queues, so that the queue adds one
	// binding rather than tiers × lanes queues; a retry carries the header
	// CC: [<name>] and comes back to this queue only. "per-queue": in lanes
	// of its own (<name>.retry.<delay>.l<n> behind <name>.retry). Either
	// costs one TTL hop per retry. Defaults to "per-queue", so that a
	// config written before shared tiers existed declares what it did;
	// the shipped config.yaml chooses "shared".
	TierQueues string `yaml:"tier_queues"`
	// ImmediateRetries is how many times a transient or timed-out handler
	// attempt is retried at once, in process, on the same delivery, before
	// the failure goes to a delayed retry; every delivery of the message
	// gets its own. Each counts as an attempt toward MaxAttempts. A handler
	// abandoned past its deadline, a panic, a Retry-After, an open breaker,
	// a stopping runtime or a delivery held so long that another call could
	// keep it unacked past 10 minutes (the broker's consumer_timeout)
	// goes to a delayed retry at once. Must be >= 0.
	// Defaults to 0 (off).
	ImmediateRetries int `yaml:"immediate_retries"`
}

// Retry.TierQueues values.
const (
	TierQueuesShared   = "shared"
	TierQueuesPerQueue = "per-queue"
)

// SharedTiers names the objects the shared delay tiers are made of, every
// one starting with Prefix (P):
//
//	P.delay (direct) ──key = tier──▶ P.delay.<ttl> (quorum, x-message-ttl, DLX P.return, no DL routing key)
//	P.return (direct, internal; alternate exchange P.return.unrouted) ──key = work queue──▶ that work queue
//	P.return.unrouted (fanout, internal) ──▶ P.unrouted (a quarantine: its records and events streams beside it)
type SharedTiers struct {
	// Prefix starts the name of every shared object. Configs that use the
	// same prefix on one virtual host share its tiers (a tier is named by
	// its TTL, so equal delays share a queue). No queue retrying through
	// the shared tiers may be named "<prefix>.delay.*": a tier's routing
	// key travels with every retry, and a work queue of that name would
	// get the others' retries. Defaults to "dlxbridge".
	Prefix string `yaml:"prefix"`
}

// defaultSharedPrefix is SharedTiers.Prefix's default.
const defaultSharedPrefix = "dlxbridge"

// DelayExchange is where the runtime publishes retries into shared tiers.
func (s SharedTiers) DelayExchange() string { return s.Prefix + ".delay" }

// tierQueue names the shared tier queue whose TTL is ttl.
func (s SharedTiers) tierQueue(ttl time.Duration) string {
	return s.Prefix + ".delay." + compactDuration(ttl)
}

// ReturnExchange is where shared tiers dead-letter expired retries.
func (s SharedTiers) ReturnExchange() string { return s.Prefix + ".return" }

// UnroutedExchange is the return exchange's alternate exchange: what it
// cannot route (a retry whose work queue was deleted) goes there.
func (s SharedTiers) UnroutedExchange() string { return s.Prefix + ".return.unrouted" }

// Unrouted is the catch-all quarantine behind UnroutedExchange.
func (s SharedTiers) Unrouted() string { return s.Prefix + ".unrouted" }

// Shared reports whether q's retries wait in the shared tiers.
func (r Retry) Shared() bool { return r.TierQueues == TierQueuesShared }

// Quarantine settings of one queue.
type Quarantine struct {
	// Queue is the quarantine queue's name. Queues that name the same
	// quarantine share it. Defaults to "<name>.quarantine".
	Queue string `yaml:"queue"`
	// Retention is how long quarantine records are kept: the records
	// stream's x-max-age (rounded up to whole seconds), and the age past
	// which `quarantine stats` counts a record as expired instead of open.
	// The intake queue itself never expires, drops or dead-letters anything.
	// Defaults to 336h (14d).
	Retention time.Duration `yaml:"retention"`
	// MaxOpenAge is how long an open record may live: until then the
	// runtime carries it forward (stores it again, same id) before
	// retention would delete it; past it, it is left to expire, with an
	// aged-out event and metric. Must be >= 0. Defaults to 0 (forever).
	MaxOpenAge time.Duration `yaml:"max_open_age"`
	// Redact lists what is scrubbed from a message before it is quarantined.
	Redact Redact `yaml:"redact"`
	// MaxRedrives is how many times one message may be replayed out of the
	// quarantine; `quarantine replay` refuses a message that has used them
	// up. Must be >= 0 (0 forbids replay). Defaults to 3.
	MaxRedrives *int `yaml:"max_redrives"`
	// AutoRedrive replays what an outage parked here once the queue's
	// breaker closes (docs/quarantine.md). Defaults to off.
	AutoRedrive AutoRedrive `yaml:"auto_redrive"`
}

// Redact lists headers and body fields to scrub before quarantine.
type Redact struct {
	// Headers are AMQP header names whose values are replaced by
	// "[redacted]". Defaults to none.
	Headers []string `yaml:"headers"`
	// Fields are JSON pointers (RFC 6901, e.g. "/customer/email") into the
	// body whose values are replaced by "[redacted]"; every other byte stays
	// as received, and the envelope lists what was replaced. A body over
	// Schemas.MaxBodyBytes or not JSON is kept as received, with a note.
	// Defaults to none.
	Fields []string `yaml:"fields"`
}

// MessageIdentity says how a message names its type and schema version.
type MessageIdentity struct {
	// From is "properties", "envelope" or "pointer" (schemas.FromProperties,
	// FromEnvelope, FromPointer). Defaults to "properties".
	From string `yaml:"from"`
	// VersionHeader is the header holding the schema version when From is
	// "properties". Defaults to "schema-version".
	VersionHeader string `yaml:"version_header"`
	// TypePointer is the JSON pointer of the type when From is "pointer".
	// Defaults to "/type".
	TypePointer string `yaml:"type_pointer"`
	// VersionPointer is the JSON pointer of the version when From is
	// "pointer". Defaults to "/schemaVersion".
	VersionPointer string `yaml:"version_pointer"`
}

// Accept names a message type and the schema versions a queue takes.
type Accept struct {
	// Type is the message type, e.g. "orders.created". Required.
	Type string `yaml:"type"`
	// Versions are the accepted schema versions, e.g. ["1", "2"]. Each must
	// exist in the registry as schemas/<type>/v<version>.json. Required.
	Versions []string `yaml:"versions"`
}

// Names other packages and the CLI build on: the connection name, the
// work exchange's type, the quarantine queue's suffix and the signing key's
// environment variable.
const (
	DefaultConnectionName = "dlxbridge"
	DefaultExchangeType   = "topic"
	QuarantineSuffix      = ".quarantine"
	DefaultSigningKeyEnv  = "DLXBRIDGE_SIGNING_KEY"
)

// The defaults Complete fills in, and the bounds Validate holds the file to.
const (
	defaultDeliveryLimit  = 5
	defaultPrefetch       = 20
	defaultConcurrency    = 4
	defaultHandlerTimeout = 30 * time.Second
	defaultJitter         = 0.2
	defaultLanes          = 4
	defaultMaxAttempts    = 5
	defaultMaxElapsed     = 15 * time.Minute
	defaultRetention      = 14 * 24 * time.Hour
	maxLanes              = 16
	// maxTTL is the longest queue TTL a retry lane may have: the broker's
	// timers hold 2^32-1 ms.
	maxTTL = (1<<32 - 1) * time.Millisecond
)

// defaultTiers are the retry delays used when a queue names none.
func defaultTiers() []time.Duration {
	return []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute}
}

// JitterValue returns the effective jitter (defaults applied).
func (r Retry) JitterValue() float64 {
	if r.Jitter == nil {
		return defaultJitter
	}
	return *r.Jitter
}

// MaxElapsedValue returns the effective time budget (0 = none).
func (r Retry) MaxElapsedValue() time.Duration {
	if r.MaxElapsed == nil {
		return defaultMaxElapsed
	}
	return *r.MaxElapsed
}

// Policy is the retry policy the queue's retry and consumer settings make
// (defaults applied); triage.Policy.Problems holds its rules.
func (q *Queue) Policy() triage.Policy {
	return triage.Policy{
		Tiers:               q.Retry.Tiers,
		Lanes:               q.Retry.Lanes,
		Jitter:              q.Retry.JitterValue(),
		MaxAttempts:         q.Retry.MaxAttempts,
		MaxElapsed:          q.Retry.MaxElapsedValue(),
		CrashLoopDeliveries: q.Consumer.CrashLoopDeliveries,
		ImmediateRetries:    q.Retry.ImmediateRetries,
	}
}

// GateConfig is the configuration of q's schema gate over reg: its
// message identity and accepted types, decoding at most maxBody bytes
// (schemas.max_body_bytes). The runtime, a replay's check and the CLI's
// validate build their gates with it, so that they agree.
func (q *Queue) GateConfig(reg *schemas.Registry, maxBody int) schemas.GateConfig {
	accepts := make(map[string][]string, len(q.Accepts))
	for _, a := range q.Accepts {
		accepts[a.Type] = a.Versions
	}
	return schemas.GateConfig{Registry: reg, Identity: q.Message.Identity(), Accepts: accepts, MaxBodyBytes: maxBody}
}

// Identity is the schema gate's identity for this message section;
// schemas.Identity holds its defaults and rules.
func (m MessageIdentity) Identity() schemas.Identity {
	return schemas.Identity{From: m.From, VersionHeader: m.VersionHeader, TypePointer: m.TypePointer, VersionPointer: m.VersionPointer}
}

// UsesSharedTiers reports whether any queue retries through the shared
// tiers.
func (c *Config) UsesSharedTiers() bool {
	for i := range c.Queues {
		if c.Queues[i].Retry.Shared() {
			return true
		}
	}
	return false
}

// UnroutedQuarantine is the shared tiers' catch-all as a queue entry, for
// the components that serve quarantines by their queue's settings (the
// keeper, the Inspector): Name and Quarantine.Queue are SharedTiers'
// Unrouted, retention the longest of the shared queues' (no retry is kept
// shorter than its own queue would keep it), redaction the union of
// theirs, its redrive budget the largest of theirs (a replay is counted
// against the budget of the queue it goes to when that queue is in the
// config). ok is false when no queue uses the shared tiers.
func (c *Config) UnroutedQuarantine() (q *Queue, ok bool) {
	u := &Queue{Name: c.SharedTiers.Unrouted(), Gate: GateOff}
	u.Quarantine.Queue = u.Name
	redrives := 0
	for i := range c.Queues {
		s := &c.Queues[i]
		if !s.Retry.Shared() {
			continue
		}
		ok = true
		u.Quarantine.Retention = max(u.Quarantine.Retention, s.Quarantine.Retention)
		u.Quarantine.Redact.Headers = append(u.Quarantine.Redact.Headers, s.Quarantine.Redact.Headers...)
		u.Quarantine.Redact.Fields = append(u.Quarantine.Redact.Fields, s.Quarantine.Redact.Fields...)
		redrives = max(redrives, s.Quarantine.MaxRedrivesValue())
	}
	if u.Quarantine.Retention == 0 {
		u.Quarantine.Retention = defaultRetention
	}
	u.Quarantine.MaxRedrives = &redrives
	return u, ok
}

// QueueByName returns the queue with that name.
func (c *Config) QueueByName(name string) (*Queue, bool) {
	for i := range c.Queues {
		if c.Queues[i].Name == name {
			return &c.Queues[i], true
		}
	}
	return nil, false
}
