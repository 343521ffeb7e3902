package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// writeRunConfig writes a one-queue config for `dlxbridge run` named with
// the test's prefix; forward is the queue's forward block ("" for none).
func writeRunConfig(t *testing.T, env *brokertest.Env, forward string) *topoBundle {
	t.Helper()
	doc := fmt.Sprintf(`broker:
  management_url: %q
run:
  listen: 127.0.0.1:0
queues:
  - name: %s
    exchange: {name: %s}
    retry: {tiers: [200ms], jitter: 0}
    accepts: [{type: orders.created, versions: ["1"]}]
%s`, env.ManagementURL, env.Name("work"), env.Name("ex"), forward)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return &topoBundle{env: env, config: path, work: env.Name("work")}
}

// Without --apply or --allow-drift, run refuses a broker whose topology
// differs from the config, and declares nothing.
func TestRunRefusesToStartOnDrift(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	b := writeRunConfig(t, env, "    forward: {url: \"http://127.0.0.1:1/x\"}\n")
	_, errOut := b.mustRunAll(t, cli.ExitFail, "run", "--config", b.config)
	if !strings.Contains(errOut, "differs from the config") || !strings.Contains(errOut, "--apply") {
		t.Errorf("stderr does not explain the refusal:\n%s", errOut)
	}
	if code, _, _ := b.run(t, "topology", "verify", "--config", b.config); code == cli.ExitOK {
		t.Error("run declared the topology without --apply")
	}
}

// run needs a forward URL for every queue, on an allowed host.
func TestRunNeedsAForwardURL(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	b := writeRunConfig(t, env, "")
	_, errOut := b.mustRunAll(t, cli.ExitUsage, "run", "--config", b.config)
	if !strings.Contains(errOut, "queues[0].forward.url is required") {
		t.Errorf("stderr:\n%s", errOut)
	}
	b = writeRunConfig(t, env, "    forward: {url: \"http://example.com/x\"}\n")
	_, errOut = b.mustRunAll(t, cli.ExitUsage, "run", "--config", b.config, "--apply")
	if !strings.Contains(errOut, "neither loopback nor listed in run.forward_hosts") {
		t.Errorf("stderr:\n%s", errOut)
	}
	// A bad --listen is bad usage, named by its flag.
	b = writeRunConfig(t, env, "    forward: {url: \"http://127.0.0.1:1/x\"}\n")
	if _, errOut = b.mustRunAll(t, cli.ExitUsage, "run", "--config", b.config, "--listen", "nonsense"); !strings.Contains(errOut, "--listen \"nonsense\" is not host:port") {
		t.Errorf("stderr:\n%s", errOut)
	}
}
