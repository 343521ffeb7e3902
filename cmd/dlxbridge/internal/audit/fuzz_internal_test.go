package audit

import (
	"encoding/json"
	"testing"

	"github.com/dlxbridge/dlxbridge/topology"
)

// Whatever the management API answers (other applications' names and
// arguments, odd types, a broker's inconsistent shapes), decoding and the
// rules never panic, and the report is valid JSON naming known rules.
func FuzzRun(f *testing.F) {
	f.Add([]byte(`{"queues":[{"name":"q","type":"quorum","arguments":{"x-delivery-limit":-1,"x-dead-letter-exchange":"d","x-dead-letter-routing-key":"q"},"effective_policy_definition":[]}],
		"exchanges":[{"name":"d","type":"topic","arguments":{"alternate-exchange":"d"}}],"bindings":[{"source":"d","destination":"q","destination_type":"queue","routing_key":"#.q"}],
		"policies":[{"name":"p","pattern":"(","apply-to":"all","definition":{"ha-mode":"all","delivery-limit":"x"}}],
		"consumers":[{"queue":{"name":"q"},"prefetch_count":0,"ack_required":true,"channel_details":[]}]}`), uint8(3))
	f.Add([]byte(`{"queues":[{"name":"a","arguments":{"x-message-ttl":1e400,"x-dead-letter-exchange":""}},{"name":"","type":"stream","messages":-5}]}`), uint8(4))
	f.Fuzz(func(t *testing.T, data []byte, major uint8) {
		var in struct {
			Queues, Exchanges, Bindings, Policies, Consumers []json.RawMessage
		}
		if json.Unmarshal(data, &in) != nil {
			return
		}
		vh := &Vhost{Name: "/", Read: Listings{true, true, true, true, true}}
		for _, raw := range in.Queues {
			if q, err := decodeQueue(raw); err == nil {
				vh.Queues = append(vh.Queues, q)
			}
		}
		for _, raw := range in.Exchanges {
			if x, err := decodeExchange(raw); err == nil {
				vh.Exchanges = append(vh.Exchanges, x)
			}
		}
		for _, raw := range in.Bindings {
			if b, err := decodeBinding(raw); err == nil {
				vh.Bindings = append(vh.Bindings, b)
			}
		}
		for _, raw := range in.Policies {
			if p, err := decodePolicy(raw, false); err == nil {
				vh.Policies = append(vh.Policies, p)
			}
		}
		for _, raw := range in.Consumers {
			if c, err := decodeConsumer(raw); err == nil {
				vh.Consumers = append(vh.Consumers, c)
			}
		}
		s := &Snapshot{Version: topology.BrokerVersion{Major: int(major % 6), Minor: 10}, Vhosts: []*Vhost{vh}}
		r := Run(s, nil, Options{})
		known := map[string]bool{}
		for _, ri := range Rules() {
			known[ri.ID] = true
		}
		for i, f := range r.Findings {
			if !known[f.Rule] {
				t.Errorf("finding of unknown rule %q", f.Rule)
			}
			if i > 0 && f.Severity > r.Findings[i-1].Severity {
				t.Errorf("findings not sorted by severity")
			}
		}
		if _, err := json.Marshal(r); err != nil {
			t.Errorf("report does not marshal: %v", err)
		}
	})
}
