package quarantine

import (
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/schemas"
)

// A replay publishes to the default exchange: a CC or BCC header there is
// sender-selected distribution. As an array it copies the message into
// every queue it names (past --to-queue); as the string --set-header
// gives, 3.10 and 4.3 close the channel with 406 mid-replay. Neither is a
// repair.
func TestPatchCheckRefusesRoutingHeaders(t *testing.T) {
	for _, k := range []string{"CC", "BCC", "cc", "Bcc"} {
		p := &Patch{Headers: map[string]string{k: "other-queue"}}
		if err := p.Check(); err == nil {
			t.Errorf("Check accepted --set-header %s=other-queue", k)
		}
	}
	if err := (&Patch{Headers: map[string]string{"ccx": "1", "schema-version": "2"}}).Check(); err != nil {
		t.Errorf("Check refused an ordinary header: %v", err)
	}
}

// C1 controls (U+0080–U+009F, e.g. CSI U+009B) are control characters
// too: an 8-bit terminal showing the audit trail acts on them.
func TestPatchCheckRefusesC1Controls(t *testing.T) {
	for _, p := range []*Patch{
		{Headers: map[string]string{"schema-version": "2\u009b31m"}},
		{Headers: map[string]string{"a\u0085b": "1"}},
		{Type: "orders.created\u009d"},
	} {
		if err := p.Check(); err == nil {
			t.Errorf("Check accepted %q", p.String())
		}
	}
}

// --set-version is resolved per record's queue: its own version header,
// or a refusal naming --patch where the queue reads the version from the
// body; other queues of the config don't matter.
func TestPatchVersionFollowsEachQueue(t *testing.T) {
	t.Parallel()
	props := &config.Queue{Name: "orders", Message: config.MessageIdentity{From: schemas.FromProperties, VersionHeader: "schema-version"}}
	custom := &config.Queue{Name: "billing", Message: config.MessageIdentity{VersionHeader: "x-app-version"}}
	body := &config.Queue{Name: "notifications", Message: config.MessageIdentity{From: schemas.FromEnvelope}}
	p := &Patch{Version: "2", Headers: map[string]string{"tenant": "a"}}
	for qc, want := range map[*config.Queue]string{props: "schema-version", custom: "x-app-version"} {
		got, err := p.forQueue(qc)
		if err != nil || got.Headers[want] != "2" || got.Headers["tenant"] != "a" || got.Version != "" {
			t.Errorf("%s: %+v %v, want %s=2", qc.Name, got, err, want)
		}
	}
	if p.Headers["schema-version"] != "" {
		t.Error("forQueue changed the patch it was given")
	}
	if _, err := p.forQueue(body); err == nil || !strings.Contains(err.Error(), "--patch") {
		t.Errorf("a queue reading the version from the body: %v, want a refusal naming --patch", err)
	}
	both := &Patch{Version: "2", Headers: map[string]string{"schema-version": "3"}}
	if _, err := both.forQueue(props); err == nil {
		t.Error("--set-version and --set-header of the same header both accepted")
	}
}
