package cli

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/audit"
	"github.com/dlxbridge/dlxbridge/topology"
)

// Queue names are other applications' text: on the terminal they must not
// move the cursor, set the title or fake a line, and a long one must not
// widen the report past 100 columns.
func TestAuditTextEscapesNamesAndFits(t *testing.T) {
	t.Parallel()
	hostile := "q\x1b]0;pwned\x07\u202e\n" + strings.Repeat("n", 150)
	vh := &audit.Vhost{Name: "/", Read: audit.Listings{Queues: true, Exchanges: true, Bindings: true, Policies: true, Consumers: true},
		Queues: []audit.Queue{{Name: hostile, Type: "quorum", Arguments: map[string]any{"x-dead-letter-exchange": hostile + ".dead"}}}}
	r := audit.Run(&audit.Snapshot{Version: topology.BrokerVersion{Major: 4}, Cluster: "c\x1b[2J", Vhosts: []*audit.Vhost{vh}}, nil, audit.Options{})
	if len(r.Findings) == 0 {
		t.Fatal("no finding to render")
	}
	for _, wide := range []bool{false, true} {
		var b strings.Builder
		if err := writeAuditText(&b, r, "warning", wide); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if strings.ContainsAny(out, "\x1b\x07\u202e") || strings.Contains(out, hostile) {
			t.Errorf("wide=%t: the output carries the name's control characters:\n%s", wide, out)
		}
		if !strings.Contains(out, `\x1b]0;pwned\a`) {
			t.Errorf("wide=%t: the name is not shown escaped:\n%s", wide, out)
		}
		for _, l := range strings.Split(out, "\n") {
			if !wide && utf8.RuneCountInString(l) > tableWidth {
				t.Errorf("line of %d columns: %q", utf8.RuneCountInString(l), l)
			}
		}
	}
}
