package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
	"github.com/dlxbridge/dlxbridge/internal/wireval"
	"github.com/dlxbridge/dlxbridge/topology"
)

// runSuggest prints a config.yaml fragment that brings an existing queue
// under the bridge: its exchange and binding keys, its delivery limit and
// length cap where they are safe to keep. The bridge never changes an
// existing queue, so where the queue's type or arguments differ from what
// the bridge declares, the fragment says so: `topology apply` would refuse,
// and the way over is a new queue. Exit 0 printed, 1 no such queue or the
// API failed.
func runSuggest(ctx context.Context, env *Env, client *mgmtapi.Client, vhost, name string) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(env.Stderr, "dlxbridge audit --suggest: %s\n", fmt.Sprintf(format, a...))
		return ExitFail
	}
	m := &topology.Management{BaseURL: client.BaseURL, Vhost: vhost, User: client.User, Password: client.Password, Client: client.HTTP}
	var overview struct {
		Version string `json:"rabbitmq_version"`
	}
	if err := client.Get(ctx, "/api/overview", &overview); err != nil {
		return fail("%v", err)
	}
	v, err := topology.ParseBrokerVersion(overview.Version)
	if err != nil {
		return fail("%v", err)
	}
	q, err := m.Queue(ctx, name)
	if errors.Is(err, topology.ErrNotFound) {
		return fail("no queue %q in vhost %q", printable(name, ""), printable(vhost, ""))
	}
	if err != nil {
		return fail("%v", err)
	}
	bs, err := m.QueueBindings(ctx, name)
	if err != nil {
		return fail("%v", err)
	}
	keys := map[string][]string{}
	for _, b := range bs {
		if b.Source != "" {
			keys[b.Source] = append(keys[b.Source], b.RoutingKey)
		}
	}
	sources := make([]string, 0, len(keys))
	for s := range keys {
		sources = append(sources, s)
	}
	// The exchange with the most bindings to the queue: a config queue has
	// one exchange.
	sort.Slice(sources, func(i, j int) bool {
		if len(keys[sources[i]]) != len(keys[sources[j]]) {
			return len(keys[sources[i]]) > len(keys[sources[j]])
		}
		return sources[i] < sources[j]
	})
	var notes []string
	exchange, kind := name, config.DefaultExchangeType
	var bindings []string
	if len(sources) > 0 {
		exchange, bindings = sources[0], keys[sources[0]]
		sort.Strings(bindings)
		x, err := m.Exchange(ctx, exchange)
		if err != nil {
			return fail("%v", err)
		}
		kind = x.Type
		for _, s := range sources[1:] {
			notes = append(notes, fmt.Sprintf("also bound from exchange '%s' (keys %s): one exchange per queue here; bind it by hand", s, strings.Join(keys[s], ", ")))
		}
	} else {
		notes = append(notes, "bound to no exchange but the default one: the bridge declares a "+kind+" exchange under the queue's name")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "queues:\n  - name: %s\n    exchange:\n      name: %s\n      type: %s\n", yamlString(name), yamlString(exchange), yamlString(kind))
	if len(bindings) > 0 {
		quoted := make([]string, len(bindings))
		for i, k := range bindings {
			quoted[i] = yamlString(k)
		}
		fmt.Fprintf(&b, "    bindings: [%s]\n", strings.Join(quoted, ", "))
	}
	if n, res := wireval.Int(q.Arguments[topology.ArgDeliveryLimit]); res == wireval.IntOK && n > 0 && n < 1000 {
		fmt.Fprintf(&b, "    delivery_limit: %d\n", n)
	}
	if n, res := wireval.Int(q.Arguments[topology.ArgMaxLength]); res == wireval.IntOK && n > 0 {
		fmt.Fprintf(&b, "    max_length: %d          # kept; the bridge caps with reject-publish, never drop-head\n", n)
	}
	b.WriteString("    gate: \"off\"              # until schemas are written: then accepts (types and versions) and gate: enforce\n")
	frag := b.String()
	cfg, err := config.Parse([]byte(frag))
	if err != nil {
		return fail("the bridge cannot take this queue as it is named: %v", err)
	}
	topo, err := topology.Build(cfg, v)
	if err != nil {
		return fail("%v", err)
	}
	for _, d := range workQueueDiff(topo, q) {
		notes = append(notes, "apply refuses while the queue differs: "+d)
	}
	if len(notes) > 0 && hasRefusal(notes) {
		notes = append(notes, "the bridge never changes an existing queue: declare the topology under a new queue name, move the producers' bindings to it, drain the old queue")
	}
	out := "# config.yaml fragment for queue '" + printable(name, "") + "' (vhost '" + printable(vhost, "") + "', RabbitMQ " + v.String() + ")\n"
	for _, n := range notes {
		out += "# " + printable(n, "") + "\n"
	}
	_, err = fmt.Fprint(env.Stdout, out+frag)
	if err != nil {
		return fail("%v", err)
	}
	return ExitOK
}

func hasRefusal(notes []string) bool {
	for _, n := range notes {
		if strings.HasPrefix(n, "apply refuses") {
			return true
		}
	}
	return false
}

// workQueueDiff lists how the existing queue differs from the work queue
// the topology declares: type, then every argument either side has.
func workQueueDiff(t *topology.Topology, have *topology.MgmtQueue) []string {
	var want *topology.QueueSpec
	for i := range t.Queues {
		if t.Queues[i].Role == topology.RoleWork {
			want = &t.Queues[i]
		}
	}
	if want == nil {
		return nil
	}
	var out []string
	if have.Type != topology.QueueTypeQuorum {
		out = append(out, fmt.Sprintf("type: want %q, have %q", topology.QueueTypeQuorum, have.Type))
	}
	args := map[string]bool{}
	for k := range want.Args {
		args[k] = true
	}
	for k := range have.Arguments {
		args[k] = true
	}
	names := make([]string, 0, len(args))
	for k := range args {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if k == topology.ArgQueueType {
			continue
		}
		w, h := topology.FormatArg(want.Args[k]), topology.FormatArg(have.Arguments[k])
		if w != h {
			out = append(out, fmt.Sprintf("%s: want %s, have %s", k, w, h))
		}
	}
	return out
}

// yamlString quotes s for YAML: a JSON string is a YAML double-quoted
// scalar.
func yamlString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
