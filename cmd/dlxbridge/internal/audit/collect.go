package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
	"github.com/dlxbridge/dlxbridge/topology"
)

// Spec says what Collect reads.
type Spec struct {
	// Vhost is the virtual host to audit, unless AllVhosts. Defaults to
	// "/".
	Vhost     string
	AllVhosts bool
	// PageSize is how many queues or exchanges one request reads.
	// Defaults to mgmtapi.MaxPageSize (500), the broker's largest.
	PageSize int
	// Prometheus reads the broker's Prometheus endpoint
	// (rabbitmq_prometheus; see NewPrometheus). When set, its counters of
	// dropped dead letters are read twice, Interval apart. Defaults to nil
	// (not read).
	Prometheus *mgmtapi.Client
	// Interval is the time between the two reads. Defaults to 10s.
	Interval time.Duration
	// BetweenReads, when set, runs between the two Prometheus reads
	// instead of waiting Interval: a test drops a dead letter there.
	// Defaults to nil.
	BetweenReads func(context.Context) error
}

// queueColumns are the queue fields the rules use: a listing with every
// statistic is several times larger.
const queueColumns = "name,vhost,type,durable,arguments,policy,operator_policy,effective_policy_definition,consumers,messages,messages_ready,delivery_limit"

const exchangeColumns = "name,vhost,type,internal,arguments"

// maxChannelReads bounds how many channels Collect reads to see whether a
// consumer without a prefetch of its own shares its channel's.
const maxChannelReads = 100

// Collect reads the snapshot. An error means nothing could be audited (the
// API did not answer, refused the login, or is not a RabbitMQ management
// API). A listing that failed part way, or that the user may not read, is
// named in notChecked, and the rules that need it skip that vhost.
func Collect(ctx context.Context, c *mgmtapi.Client, spec Spec) (s *Snapshot, notChecked []string, err error) {
	var overview struct {
		Version     string `json:"rabbitmq_version"`
		Product     string `json:"product_version"`
		ClusterName string `json:"cluster_name"`
	}
	if err := c.Get(ctx, "/api/overview", &overview); err != nil {
		if errors.Is(err, mgmtapi.ErrNotFound) {
			return nil, nil, fmt.Errorf("management API at %s: /api/overview not found", c.BaseURL)
		}
		return nil, nil, err
	}
	vs := overview.Version
	if vs == "" {
		vs = overview.Product
	}
	v, err := topology.ParseBrokerVersion(vs)
	if err != nil {
		return nil, nil, fmt.Errorf("management API at %s: %w", c.BaseURL, err)
	}
	s = &Snapshot{Version: v, Cluster: overview.ClusterName}
	notChecked = append(notChecked, sightOf(ctx, c, spec.AllVhosts)...)
	names := []string{spec.Vhost}
	if spec.Vhost == "" {
		names[0] = "/"
	}
	if spec.AllVhosts {
		var vhosts []struct {
			Name string `json:"name"`
		}
		if err := c.Get(ctx, "/api/vhosts?columns=name", &vhosts); err != nil {
			return nil, nil, fmt.Errorf("list vhosts: %w", err)
		}
		names = names[:0]
		for _, vh := range vhosts {
			names = append(names, vh.Name)
		}
		sort.Strings(names)
	}
	for _, name := range names {
		vh, nc, err := collectVhost(ctx, c, name, spec.PageSize)
		if err != nil {
			return nil, nil, err
		}
		notChecked = append(notChecked, nc...)
		if vh != nil {
			s.Vhosts = append(s.Vhosts, vh)
		}
	}
	if spec.Prometheus != nil {
		drops, nc, err := sampleDrops(ctx, spec, s.Cluster)
		if err != nil {
			return nil, nil, err
		}
		s.Drops = drops
		notChecked = append(notChecked, nc...)
	}
	return s, notChecked, nil
}

// sightOf says what the management API hides from the auditing user: a
// user without the monitoring (or administrator) tag is shown only its own
// connections' consumers and channels, and only the vhosts it has
// permissions in (seen on 3.10.8: /api/consumers listed another user's
// consumer to a monitoring user and not to a management one), so the
// audit would miss another application's consumer with no prefetch. Its
// tags come from /api/whoami; one that cannot be read is said too.
func sightOf(ctx context.Context, c *mgmtapi.Client, allVhosts bool) []string {
	var who struct {
		Name string `json:"name"`
		Tags any    `json:"tags"` // a list (3.9+), or a comma-separated string
	}
	if err := c.Get(ctx, "/api/whoami", &who); err != nil {
		return []string{fmt.Sprintf("the auditing user's tags (/api/whoami: %v): without the monitoring tag other users' consumers are not shown", err)}
	}
	var tags []string
	switch v := who.Tags.(type) {
	case string:
		tags = strings.Split(v, ",")
	case []any:
		for _, t := range v {
			if s, ok := t.(string); ok {
				tags = append(tags, s)
			}
		}
	}
	for _, t := range tags {
		if t = strings.TrimSpace(t); t == "monitoring" || t == "administrator" {
			return nil
		}
	}
	what := "consumers of other users' connections (consumer-no-prefetch checked only the user's own)"
	if allVhosts {
		what += ", and vhosts the user has no permissions in (not listed to it)"
	}
	return []string{fmt.Sprintf("%s: user %q has no monitoring tag, and the management API hides them from it; give it the monitoring tag", what, who.Name)}
}

// collectVhost reads one vhost's listings. A listing that fails is noted,
// and the others are read all the same: a user may be refused one (say,
// operator policies) and not the rest. A vhost the user may not read at
// all (refused, or hidden behind a 404 as 4.3 does) is one note and no
// Vhost. Only the context's end is an error.
func collectVhost(ctx context.Context, c *mgmtapi.Client, name string, pageSize int) (*Vhost, []string, error) {
	vh := &Vhost{Name: name}
	vp := url.PathEscape(name)
	var notChecked []string
	note := func(what string, err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var se *mgmtapi.StatusError
		if errors.As(err, &se) && se.Denied() {
			notChecked = append(notChecked, fmt.Sprintf("%s of vhost %q: the user may not read them (%s); give it the monitoring tag and permissions in the vhost", what, name, se.Status))
		} else {
			notChecked = append(notChecked, fmt.Sprintf("%s of vhost %q: %v", what, name, err))
		}
		return nil
	}
	seen := map[string]bool{}
	_, err := c.Pages(ctx, "/api/queues/"+vp+"?columns="+queueColumns, pageSize, func(raw json.RawMessage) error {
		q, err := decodeQueue(raw)
		if err != nil {
			return err
		}
		// A queue declared while the listing is read can shift one from
		// one page onto the next: keep the first.
		if !seen[q.Name] {
			seen[q.Name] = true
			vh.Queues = append(vh.Queues, q)
		}
		return nil
	})
	var se *mgmtapi.StatusError
	switch {
	case err == nil:
		vh.Read.Queues = true
	case len(vh.Queues) == 0 && (errors.Is(err, mgmtapi.ErrNotFound) || errors.As(err, &se) && se.Denied()):
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		why := "not found: it was deleted, or the user may not see it"
		if se != nil {
			why = "the user may not read it (" + se.Status + ")"
		}
		return nil, []string{fmt.Sprintf("vhost %q: %s; give the user permissions in it (the monitoring tag and any permission entry, even empty, are enough)", name, why)}, nil
	default:
		if err := note("queues", err); err != nil {
			return nil, nil, err
		}
	}
	seenX := map[string]bool{}
	_, err = c.Pages(ctx, "/api/exchanges/"+vp+"?columns="+exchangeColumns, pageSize, func(raw json.RawMessage) error {
		x, err := decodeExchange(raw)
		if err != nil {
			return err
		}
		if !seenX[x.Name] {
			seenX[x.Name] = true
			vh.Exchanges = append(vh.Exchanges, x)
		}
		return nil
	})
	if err != nil {
		if err := note("exchanges", err); err != nil {
			return nil, nil, err
		}
	} else {
		vh.Read.Exchanges = true
	}
	// Bindings, policies and consumers are not paginated by the API.
	if err := readBindings(ctx, c, vh); err != nil {
		if err := note("bindings", err); err != nil {
			return nil, nil, err
		}
	} else {
		vh.Read.Bindings = true
	}
	policiesOK := true
	for _, p := range []struct {
		path     string
		operator bool
		what     string
	}{{"/api/policies/" + vp, false, "policies"}, {"/api/operator-policies/" + vp, true, "operator policies"}} {
		err := list(ctx, c, p.path, func(raw json.RawMessage) error {
			pol, err := decodePolicy(raw, p.operator)
			vh.Policies = append(vh.Policies, pol)
			return err
		})
		if err != nil {
			policiesOK = false
			if err := note(p.what, err); err != nil {
				return nil, nil, err
			}
		}
	}
	vh.Read.Policies = policiesOK
	if err := list(ctx, c, "/api/consumers/"+vp, func(raw json.RawMessage) error {
		cs, err := decodeConsumer(raw)
		vh.Consumers = append(vh.Consumers, cs)
		return err
	}); err != nil {
		if err := note("consumers", err); err != nil {
			return nil, nil, err
		}
	} else {
		vh.Read.Consumers = true
		notChecked = append(notChecked, readGlobalPrefetch(ctx, c, vh)...)
	}
	return vh, notChecked, ctx.Err()
}

// readBindings reads the exchanges' bindings one by one when there are at
// most maxSourceReads of them and at least queuesPerSource queues per
// exchange (the listing's implicit bindings outweigh the requests); else
// the vhost's whole listing, in one request.
const (
	maxSourceReads  = 200
	queuesPerSource = 50
)

// readBindings reads the vhost's bindings, except the default exchange's.
// The vhost's listing is not paged and holds one implicit binding from
// the default exchange per queue, which the routes never read (it routes
// by queue name): on a private 3.10.8 node with 20,000 queues it took 56 s
// to answer at a load average of 30, past the client's timeout. So with
// the exchanges read, few of them and many queues, each one's own
// bindings are read instead (exchange-to-exchange bindings included: they
// have a source too). An exchange deleted meanwhile has none.
func readBindings(ctx context.Context, c *mgmtapi.Client, vh *Vhost) error {
	vp := url.PathEscape(vh.Name)
	add := func(raw json.RawMessage) error {
		b, err := decodeBinding(raw)
		if err == nil && b.Source != "" {
			vh.Bindings = append(vh.Bindings, b)
		}
		return err
	}
	var sources []string
	for _, x := range vh.Exchanges {
		if x.Name != "" {
			sources = append(sources, x.Name)
		}
	}
	if !vh.Read.Exchanges || len(sources) > maxSourceReads || len(sources)*queuesPerSource > len(vh.Queues) {
		return list(ctx, c, "/api/bindings/"+vp, add)
	}
	for _, x := range sources {
		err := list(ctx, c, "/api/exchanges/"+vp+"/"+url.PathEscape(x)+"/bindings/source", add)
		if err != nil && !errors.Is(err, mgmtapi.ErrNotFound) {
			return err
		}
	}
	return nil
}

// list reads an unpaginated listing.
func list(ctx context.Context, c *mgmtapi.Client, path string, each func(json.RawMessage) error) error {
	var items []json.RawMessage
	if err := c.Get(ctx, path, &items); err != nil {
		return err
	}
	for _, it := range items {
		if err := each(it); err != nil {
			return fmt.Errorf("management API GET %s: %w", path, err)
		}
	}
	return nil
}

// readGlobalPrefetch reads, for consumers that have no prefetch of their
// own on a queue that dead-letters, their channel's shared prefetch
// (basic.qos with global set), which GET /api/consumers does not show: only
// those channels, at most maxChannelReads of them.
func readGlobalPrefetch(ctx context.Context, c *mgmtapi.Client, vh *Vhost) []string {
	queues := map[string]*Queue{}
	for i := range vh.Queues {
		queues[vh.Queues[i].Name] = &vh.Queues[i]
	}
	read := map[string]int{}
	skipped := 0
	for i := range vh.Consumers {
		cs := &vh.Consumers[i]
		q := queues[cs.Queue]
		if cs.Prefetch != 0 || !cs.AckRequired || cs.Channel == "" || q == nil || !deadLetters(vh, q) {
			continue
		}
		if g, ok := read[cs.Channel]; ok {
			cs.GlobalPrefetch = g
			continue
		}
		if len(read) >= maxChannelReads {
			skipped++
			continue
		}
		var ch struct {
			Global int `json:"global_prefetch_count"`
		}
		g := -1
		if err := c.Get(ctx, "/api/channels/"+url.PathEscape(cs.Channel)+"?columns=global_prefetch_count", &ch); err == nil {
			g = ch.Global
		}
		read[cs.Channel] = g
		cs.GlobalPrefetch = g
	}
	if skipped > 0 {
		return []string{fmt.Sprintf("the shared prefetch of %d more channel(s) of consumers with no prefetch in vhost %q: only %d are read", skipped, vh.Name, maxChannelReads)}
	}
	return nil
}
