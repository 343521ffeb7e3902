package cli

import (
	"io"
	"os"
	"path/filepath"
	"strings"
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

// What --keep prints ends with removing the config it wrote, once the
// topology is deleted: the file is the demo's, in a shared directory.
func TestDemoKeepConfigSaysToRemoveTheFile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("TMPDIR", dir)
	var out strings.Builder
	demoKeepConfig(&out, "dlxdemo", []byte("queues: []\n"), &topology.Topology{})
	files, err := filepath.Glob(filepath.Join(dir, "dlxdemo-*.yaml"))
	if err != nil || len(files) != 1 {
		t.Fatalf("config files %v (%v)", files, err)
	}
	if !strings.Contains(out.String(), "topology delete") || !strings.HasSuffix(out.String(), "rm "+files[0]+"\n") {
		t.Errorf("the output does not end by removing %s:\n%s", files[0], out.String())
	}
}
