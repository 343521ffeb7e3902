package cli

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/dlxbridge/dlxbridge/topology"
)

// The kept config goes to a shared directory under a name anyone can
// predict from --prefix: a file or symlink already there (another user's,
// pointing at one of ours) must not be followed and overwritten.
func TestDemoKeepConfigDoesNotFollowALink(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("TMPDIR", dir)
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "dlxdemo.yaml")); err != nil {
		t.Fatal(err)
	}
	demoKeepConfig(io.Discard, "dlxdemo", []byte("queues: []\n"), &topology.Topology{})
	if b, err := os.ReadFile(victim); err != nil || string(b) != "mine\n" {
		t.Errorf("the file the link points at now holds %q (%v)", b, err)
	}
}
