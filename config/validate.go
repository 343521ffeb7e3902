package config

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/urllist"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// ApplyDefaults fills every unset field with its documented default. It is
// idempotent.
func (c *Config) ApplyDefaults() {
	if c.Broker.ConnectionName == "" {
		c.Broker.ConnectionName = DefaultConnectionName
	}
	if c.Schemas.MaxBodyBytes == 0 {
		c.Schemas.MaxBodyBytes = schemas.DefaultMaxBodyBytes
	}
	if c.Security.SigningKeyEnv == "" {
		c.Security.SigningKeyEnv = DefaultSigningKeyEnv
	}
	if c.SharedTiers.Prefix == "" {
		c.SharedTiers.Prefix = defaultSharedPrefix
	}
	for i := range c.Queues {
		q := &c.Queues[i]
		if q.Exchange.Type == "" {
			q.Exchange.Type = DefaultExchangeType
		}
		if q.Bindings == nil {
			if q.Exchange.Type == "fanout" || q.Exchange.Type == "headers" {
				q.Bindings = []string{""}
			} else {
				q.Bindings = []string{q.Name}
			}
		}
		if q.DeliveryLimit == 0 {
			q.DeliveryLimit = defaultDeliveryLimit
		}
		if q.Consumer.Prefetch == 0 {
			q.Consumer.Prefetch = defaultPrefetch
		}
		if q.Consumer.Concurrency == 0 {
			q.Consumer.Concurrency = defaultConcurrency
		}
		if q.Consumer.HandlerTimeout == 0 {
			q.Consumer.HandlerTimeout = defaultHandlerTimeout
		}
		if q.Consumer.CrashLoopDeliveries == 0 {
			q.Consumer.CrashLoopDeliveries = max(q.DeliveryLimit-1, 1)
		}
		if q.Retry.Tiers == nil {
			q.Retry.Tiers = defaultTiers()
		}
		if q.Retry.Jitter == nil {
			j := defaultJitter
			q.Retry.Jitter = &j
		}
		if q.Retry.Lanes == 0 {
			if *q.Retry.Jitter == 0 {
				q.Retry.Lanes = 1
			} else {
				q.Retry.Lanes = defaultLanes
			}
		}
		if q.Retry.MaxAttempts == 0 {
			q.Retry.MaxAttempts = defaultMaxAttempts
		}
		if q.Retry.TierQueues == "" {
			q.Retry.TierQueues = TierQueuesPerQueue
		}
		if q.Retry.MaxElapsed == nil {
			d := defaultMaxElapsed
			q.Retry.MaxElapsed = &d
		}
		if q.Quarantine.Queue == "" {
			q.Quarantine.Queue = q.Name + QuarantineSuffix
		}
		if q.Quarantine.Retention == 0 {
			q.Quarantine.Retention = defaultRetention
		}
		if q.Quarantine.MaxRedrives == nil {
			n := defaultMaxRedrives
			q.Quarantine.MaxRedrives = &n
		}
		id := q.Message.Identity().WithDefaults()
		q.Message = MessageIdentity{From: id.From, VersionHeader: id.VersionHeader, TypePointer: id.TypePointer, VersionPointer: id.VersionPointer}
		if q.Gate == "" {
			q.Gate = GateEnforce
		}
		q.Breaker.applyDefaults()
		q.Quarantine.AutoRedrive.applyDefaults()
		for j := range q.Accepts {
			for k, v := range q.Accepts[j].Versions {
				q.Accepts[j].Versions[k] = schemas.NormalizeVersion(v)
			}
		}
	}
	c.applyRunDefaults()
}

// Names the broker accepts and that are safe to derive other names from.
var (
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$`)
	typeRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$`)
	versionRE = regexp.MustCompile(`^[0-9]+$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,200}$`)
)

// policyPaths and identityPaths name triage.Policy's and schemas.Identity's
// fields in the file, under a queue.
var (
	policyPaths = map[string]string{
		"Tiers":       ".retry.tiers",
		"Lanes":       ".retry.lanes",
		"Jitter":      ".retry.jitter",
		"MaxAttempts": ".retry.max_attempts",
		"MaxElapsed":  ".retry.max_elapsed",

		"ImmediateRetries": ".retry.immediate_retries",
	}
	identityPaths = map[string]string{
		"From":           "from",
		"TypePointer":    "type_pointer",
		"VersionPointer": "version_pointer",
	}
)

// Validate checks a defaulted config and returns Errors listing every problem,
// or nil.
func (c *Config) Validate() error {
	var errs Errors
	add := func(path, format string, args ...any) {
		errs = append(errs, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
	}
	if c.Broker.ManagementURL != "" {
		// One URL, or one per node, comma separated.
		entries := urllist.Split(c.Broker.ManagementURL, "http", "https")
		for i, e := range entries {
			u, err := url.Parse(e)
			if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && !strings.Contains(u.Host, ",") {
				continue
			}
			// Never quote the value: it may hold a password.
			which := ""
			if len(entries) > 1 {
				which = fmt.Sprintf("URL %d of %d: ", i+1, len(entries))
			}
			hint := ""
			if strings.Contains(e, "@") {
				hint = " (percent-encode any '#', '/', '?', '@', '%' or ':' in the user name or password, e.g. '#' as %23)"
			}
			if strings.Contains(e, ",") {
				hint += " (several nodes' APIs are URLs separated by commas, each with its scheme: http://h1:15672,http://h2:15672)"
			}
			add("broker.management_url", "%smust be an http(s) URL such as http://127.0.0.1:15672%s", which, hint)
		}
	}
	if c.Broker.Replicas < 0 {
		add("broker.replicas", "must be >= 1 (leave it out for the broker's default)")
	}
	if c.Schemas.MaxBodyBytes < 0 {
		add("schemas.max_body_bytes", "must be > 0")
	}
	if len(c.Queues) == 0 {
		add("queues", "at least one queue is required")
	}
	// Every name dlxbridge declares, to catch two objects with one name.
	claims := nameClaims{}
	sharedOK := true
	if c.UsesSharedTiers() {
		if pre := c.SharedTiers.Prefix; !nameRE.MatchString(pre) || strings.HasPrefix(pre, "amq.") || len(pre) > 150 {
			add("shared_tiers.prefix", "%q: use letters, digits, '.', '_', ':' or '-', starting with a letter or digit (at most 150), not \"amq.\"", pre)
			sharedOK = false
		}
	}
	for i := range c.Queues {
		q := &c.Queues[i]
		p := fmt.Sprintf("queues[%d]", i)
		// derivable: the fields names are derived from are sound, so the
		// names can be checked for collisions.
		derivable := false
		if q.Name == "" {
			add(p+".name", "is required")
		} else if !nameRE.MatchString(q.Name) {
			add(p+".name", "%q: use letters, digits, '.', '_', ':' or '-', starting with a letter or digit (at most 200)", q.Name)
		} else if strings.HasPrefix(q.Name, "amq.") {
			add(p+".name", "names starting with \"amq.\" are reserved by the broker")
		} else {
			derivable = true
		}
		if q.Exchange.Name == "" {
			add(p+".exchange.name", "is required (the default exchange can't be bound)")
			derivable = false
		} else if !nameRE.MatchString(q.Exchange.Name) || strings.HasPrefix(q.Exchange.Name, "amq.") {
			add(p+".exchange.name", "%q is not a name dlxbridge can declare", q.Exchange.Name)
			derivable = false
		}
		switch q.Exchange.Type {
		case "direct", "topic", "fanout", "headers":
		default:
			add(p+".exchange.type", "must be direct, topic, fanout or headers, not %q", q.Exchange.Type)
			derivable = false
		}
		if len(q.Bindings) == 0 {
			add(p+".bindings", "at least one binding key is required")
		}
		seenKey := map[string]bool{}
		for j, k := range q.Bindings {
			if seenKey[k] {
				add(fmt.Sprintf("%s.bindings[%d]", p, j), "%q is listed twice", k)
			}
			seenKey[k] = true
		}
		if q.DeliveryLimit < 1 {
			add(p+".delivery_limit", "must be >= 1 (the broker's backstop for crash-looping messages; it can't be disabled)")
		}
		if q.MaxLength < 0 {
			add(p+".max_length", "must be >= 0")
		}
		cp := p + ".consumer"
		if q.Consumer.Prefetch < 1 || q.Consumer.Prefetch > 2000 {
			add(cp+".prefetch", "must be in [1, 2000]")
		}
		if q.Consumer.Concurrency < 1 {
			add(cp+".concurrency", "must be >= 1")
		}
		if q.Consumer.HandlerTimeout <= 0 {
			add(cp+".handler_timeout", "must be > 0")
		}
		if q.Consumer.CrashLoopDeliveries < 1 {
			add(cp+".crash_loop_deliveries", "must be >= 1")
		} else if q.DeliveryLimit >= 1 && q.Consumer.CrashLoopDeliveries > q.DeliveryLimit {
			add(cp+".crash_loop_deliveries", "must be <= delivery_limit (%d) so the bridge acts before the broker", q.DeliveryLimit)
		}
		// The retry policy's rules are triage's; the config adds what its
		// queues need (TTLs in whole milliseconds, at most maxLanes lanes)
		// and its own crash_loop_deliveries rule above, where 0 means the
		// default rather than "disabled".
		rp := p + ".retry"
		for _, pr := range q.Policy().Problems() {
			path, ok := policyPaths[pr.Field]
			if !ok {
				continue // CrashLoopDeliveries: checked above
			}
			path = p + path
			if pr.Index >= 0 {
				path += fmt.Sprintf("[%d]", pr.Index)
			}
			add(path, "%s", pr.Rule)
			if pr.Field == "Tiers" || pr.Field == "Lanes" {
				derivable = false
			}
		}
		for j, d := range q.Retry.Tiers {
			tp := fmt.Sprintf("%s.tiers[%d]", rp, j)
			if d > 0 && d%time.Millisecond != 0 {
				add(tp, "must be a whole number of milliseconds (queue TTLs are in ms)")
				derivable = false
			}
			if d <= 0 || q.Retry.Lanes < 1 {
				continue
			}
			// The last lane's TTL is the longest; past 2^32-1 ms both
			// brokers declare the queue but the timer cannot hold it.
			if _, hi := triage.LaneBounds(d, q.Retry.JitterValue(), q.Retry.Lanes, q.Retry.Lanes-1); hi > maxTTL {
				add(tp, "%s with jitter %g makes a queue TTL of %s, over the broker's limit of %s (2^32-1 ms)", d, q.Retry.JitterValue(), hi.Round(time.Millisecond), maxTTL)
				derivable = false
			}
		}
		if q.Retry.Lanes > maxLanes {
			add(rp+".lanes", "must be in [1, %d]", maxLanes)
			derivable = false
		}
		switch q.Retry.TierQueues {
		case TierQueuesPerQueue:
		case TierQueuesShared:
			derivable = derivable && sharedOK
			// The tier's own routing key travels with every retry beside
			// the CC, and the return exchange routes both: a work queue
			// named like a tier (of this config or another on the vhost)
			// would get every retry that waited in it.
			if tiers := c.SharedTiers.DelayExchange() + "."; sharedOK && strings.HasPrefix(q.Name, tiers) {
				add(p+".name", "%q starts with %q, the shared tiers' names (shared_tiers.prefix): a queue of that name would receive other queues' retries", q.Name, tiers)
				derivable = false
			}
			// A full queue refuses the retries its tier dead-letters back;
			// the tier's at-least-once dead-lettering holds them, and past
			// a few dozen it holds back every queue's retries in that tier
			// until this one drains. Its own lanes hold back only its own.
			if q.MaxLength > 0 {
				add(p+".max_length", "needs retry.tier_queues: %s: a full queue refuses the retries its tier sends back, and in a shared tier they hold back every other queue's retries until it drains", TierQueuesPerQueue)
			}
		default:
			add(rp+".tier_queues", "must be %s or %s, not %q", TierQueuesShared, TierQueuesPerQueue, q.Retry.TierQueues)
			derivable = false
		}
		qp := p + ".quarantine"
		if !nameRE.MatchString(q.Quarantine.Queue) || strings.HasPrefix(q.Quarantine.Queue, "amq.") {
			add(qp+".queue", "%q is not a name dlxbridge can declare", q.Quarantine.Queue)
			derivable = false
		}
		if derivable {
			for _, n := range q.Names(c.SharedTiers) {
				path := p + "." + n.Field
				if prev, clash := claims.add(path, n); clash {
					what := ""
					if n.Role != RoleWorkQueue && n.Role != RoleWorkExchange && n.Role != RoleQuarantine && !n.Role.sharedTiers() {
						what = "its " + string(n.Role) + " "
					}
					add(path, "%s%q is also used by %s (%s); two objects can't share a name", what, n.Name, prev.path, prev.n.Describe())
				}
			}
		}
		if q.Quarantine.Retention < 0 {
			add(qp+".retention", "must be >= 0")
		}
		if q.Quarantine.MaxOpenAge < 0 {
			add(qp+".max_open_age", "must be >= 0 (0: forever)")
		}
		errs = append(errs, q.Quarantine.AutoRedrive.validate(qp+".auto_redrive", q.Breaker.EnabledValue())...)
		if q.Quarantine.MaxRedrivesValue() < 0 {
			add(qp+".max_redrives", "must be >= 0 (0 forbids replay)")
		}
		for j, f := range q.Quarantine.Redact.Fields {
			if f == "" || f[0] != '/' {
				add(fmt.Sprintf("%s.redact.fields[%d]", qp, j), "%q is not a JSON pointer (e.g. /customer/email)", f)
			}
		}
		for j, h := range q.Quarantine.Redact.Headers {
			switch {
			case h == "":
				add(fmt.Sprintf("%s.redact.headers[%d]", qp, j), "must not be empty")
			case len(h) >= len(wire.OwnPrefix) && strings.EqualFold(h[:len(wire.OwnPrefix)], wire.OwnPrefix):
				// The runtime writes its own after redaction, so a rule
				// would scrub only a producer's copy, and the keeper's
				// redaction of it would void a count a signature vouched for.
				add(fmt.Sprintf("%s.redact.headers[%d]", qp, j), "%q is one of the bridge's own headers (%s*), written after redaction: redact the values they are made from (a header or body field) instead", h, wire.OwnPrefix)
			}
		}
		mp := p + ".message"
		for _, pr := range q.Message.Identity().Problems() {
			add(mp+"."+identityPaths[pr.Field], "%s", pr.Rule)
		}
		switch q.Gate {
		case GateEnforce, GateReport:
			if len(q.Accepts) == 0 {
				add(p+".accepts", "at least one message type is required (or gate: off)")
			}
		case GateOff: // accepts are optional, and checked if given
		default:
			add(p+".gate", "must be enforce, report or off, not %q", q.Gate)
		}
		seen := map[string]bool{}
		for j, a := range q.Accepts {
			ap := fmt.Sprintf("%s.accepts[%d]", p, j)
			if !typeRE.MatchString(a.Type) {
				add(ap+".type", "%q: a type is letters, digits, '.', '_' or '-'", a.Type)
			} else if seen[a.Type] {
				add(ap+".type", "%q is listed twice", a.Type)
			}
			seen[a.Type] = true
			if len(a.Versions) == 0 {
				add(ap+".versions", "at least one version is required")
			}
			for k, v := range a.Versions {
				if !versionRE.MatchString(v) {
					add(fmt.Sprintf("%s.versions[%d]", ap, k), "%q: a version is a whole number such as 1 or v1", v)
				}
			}
		}
		if e, bad := q.Breaker.validate(p + ".breaker"); bad {
			errs = append(errs, e)
		}
	}
	if !envNameRE.MatchString(c.Security.SigningKeyEnv) {
		add("security.signing_key_env", "%q is not an environment variable name (letters, digits, '_'; the key itself never goes in this file)", c.Security.SigningKeyEnv)
	}
	c.validateRun(add)
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// Warnings lists what a valid config does that is likely not meant, one
// FieldError per finding: a retry tier longer than the time budget is never
// waited (every retry that would wait it is quarantined instead), and an
// even replica count buys no more tolerance than the odd one below it. Such
// a config works, so it is reported, not refused.
func (c *Config) Warnings() Errors {
	var ws Errors
	if r := c.Broker.Replicas; r > 0 && r%2 == 0 {
		// A majority of 2k members is k+1, as for 2k+1: the extra node
		// costs a copy of every message and survives no more failures.
		ws = append(ws, FieldError{Path: "broker.replicas",
			Msg: fmt.Sprintf("%d is even: a majority of %d members is %d, so %d replicas survive no more nodes down than %d do; use an odd number", r, r, r/2+1, r, r-1)})
	}
	for i := range c.Queues {
		q := &c.Queues[i]
		me := q.Retry.MaxElapsedValue()
		for j, d := range q.Retry.Tiers {
			if me > 0 && d > me {
				ws = append(ws, FieldError{Path: fmt.Sprintf("queues[%d].retry.tiers[%d]", i, j),
					Msg: fmt.Sprintf("%s is longer than retry.max_elapsed (%s): a retry that waits it always returns past the time budget and is quarantined instead; shorten the tier or raise max_elapsed (0 disables the budget)", d, me)})
			}
		}
	}
	return ws
}
