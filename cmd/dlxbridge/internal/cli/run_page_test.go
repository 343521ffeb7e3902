package cli_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// run.operator_token_env naming an unset variable is a config error, not
// a page that is silently read-only; run declares nothing.
func TestRunRefusesAnEmptyOperatorToken(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	b := tokenEnvConfig(t, env, "DLXBRIDGE_TEST_UNSET_TOKEN")
	_, errOut := b.mustRunAll(t, cli.ExitUsage, "run", "--config", b.config, "--apply")
	if !strings.Contains(errOut, "run.operator_token_env names DLXBRIDGE_TEST_UNSET_TOKEN, which is unset or empty") {
		t.Errorf("stderr:\n%s", errOut)
	}
	if code, _, _ := b.run(t, "topology", "verify", "--config", b.config); code == cli.ExitOK {
		t.Error("run declared the topology")
	}
}

// An operator token shorter than 16 bytes (spaces around it do not count)
// is refused at start: a few guesses would find it.
func TestRunRefusesAShortOperatorToken(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	b := tokenEnvConfig(t, env, "DLXBRIDGE_TEST_SHORT_TOKEN")
	for _, token := range []string{"a", "0123456789abcde", "   short token   \n"} {
		var out, errOut bytes.Buffer
		cenv := &cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
			switch k {
			case "RABBITMQ_URL":
				return env.URL
			case "DLXBRIDGE_TEST_SHORT_TOKEN":
				return token
			}
			return ""
		}}
		code := cli.Main(context.Background(), []string{"run", "--config", b.config}, cenv)
		if code != cli.ExitUsage || !strings.Contains(errOut.String(), "want at least 16") {
			t.Errorf("token %q: exit %d, stderr:\n%s", token, code, errOut.String())
		}
	}
}

// tokenEnvConfig is a run config whose run.operator_token_env names name.
func tokenEnvConfig(t *testing.T, env *brokertest.Env, name string) *topoBundle {
	t.Helper()
	b := writeRunConfig(t, env, "    forward: {url: \"http://127.0.0.1:1/x\"}\n")
	doc, err := os.ReadFile(b.config)
	if err != nil {
		t.Fatal(err)
	}
	doc = []byte(strings.Replace(string(doc), "  listen: 127.0.0.1:0\n", "  listen: 127.0.0.1:0\n  operator_token_env: "+name+"\n", 1))
	if err := os.WriteFile(b.config, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}
