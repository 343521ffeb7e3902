package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

// topoBundle is one CLI test: its broker slice and a config file whose every
// name starts with the test's prefix, so cleanup removes it all.
type topoBundle struct {
	env    *brokertest.Env
	config string
	work   string
}

func setupTopology(t *testing.T, retryYAML string) *topoBundle {
	t.Helper()
	env := brokertest.Require(t)
	return writeTopologyConfig(t, env, env.ManagementURL, retryYAML)
}

// writeTopologyConfig writes the test's config with managementURL as
// broker.management_url.
func writeTopologyConfig(t *testing.T, env *brokertest.Env, managementURL, retryYAML string) *topoBundle {
	t.Helper()
	if retryYAML == "" {
		retryYAML = "tiers: [200ms, 400ms]\n      jitter: 0"
	}
	work := env.Name("work")
	doc := fmt.Sprintf(`broker:
  management_url: %q
queues:
  - name: %s
    exchange:
      name: %s
      type: direct
    bindings: [k]
    delivery_limit: 3
    retry:
      %s
    accepts:
      - type: test.event
        versions: ["1"]
`, managementURL, work, env.Name("ex"), retryYAML)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return &topoBundle{env: env, config: path, work: work}
}

// run runs dlxbridge with args against the test broker (RABBITMQ_URL).
func (b *topoBundle) run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := &cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
		if k == "RABBITMQ_URL" {
			return b.env.URL
		}
		return ""
	}}
	code = cli.Main(context.Background(), args, env)
	return code, out.String(), errOut.String()
}

func (b *topoBundle) mustRun(t *testing.T, wantCode int, args ...string) string {
	t.Helper()
	out, _ := b.mustRunAll(t, wantCode, args...)
	return out
}

// mustRunAll runs dlxbridge and fails the test unless it exits wantCode.
func (b *topoBundle) mustRunAll(t *testing.T, wantCode int, args ...string) (stdout, stderr string) {
	t.Helper()
	code, out, errOut := b.run(t, args...)
	if code != wantCode {
		t.Fatalf("dlxbridge %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, wantCode, out, errOut)
	}
	return out, errOut
}

func TestTopologyApplyTwiceThenVerify(t *testing.T) {
	t.Parallel()
	b := setupTopology(t, "")
	first := b.mustRun(t, cli.ExitOK, "topology", "apply", "--config", b.config)
	if !strings.Contains(first, "created   queue '"+b.work+"'") {
		t.Errorf("first apply does not list the work queue:\n%s", first)
	}
	second := b.mustRun(t, cli.ExitOK, "topology", "apply", "--config", b.config)
	// 3 exchanges + work, two retry lanes, quarantine and its two streams;
	// 4 bindings, which only the management API can see.
	want, checked := "apply: 0 created, 13 unchanged\n", cli.ExitOK
	if b.env.ManagementURL == "" {
		want, checked = "apply: 0 created, 9 unchanged, 4 binding(s) ensured", cli.ExitIncomplete
	}
	if !strings.Contains(second, want) {
		t.Errorf("second apply changed something:\n%s", second)
	}
	plan := b.mustRun(t, checked, "topology", "plan", "--config", b.config, "--output", "json")
	var p topology.Plan
	if err := json.Unmarshal([]byte(plan), &p); err != nil {
		t.Fatalf("plan JSON: %v\n%s", err, plan)
	}
	if p.Summary.Create != 0 || p.Summary.Conflict != 0 || p.Summary.Unchanged < 7 {
		t.Errorf("plan after apply: %+v", p.Summary)
	}
	// The work queue, two retry lanes, the quarantine.
	if tot := p.Totals; tot.QuorumQueues != 4 || tot.Exchanges != 3 || tot.Bindings != 4 || len(tot.PerWorkQueue) != 1 || tot.PerWorkQueue[0].RetryLanes != 2 {
		t.Errorf("plan totals: %+v", tot)
	}
	text := b.mustRun(t, checked, "topology", "plan", "--config", b.config)
	if want := "totals: 4 quorum queues, 2 streams, 3 exchanges, 4 bindings for 1 work queue(s)\n  each work queue adds:\n    " + b.work + ": 4 quorum queues (2 retry lanes), 2 streams"; !strings.Contains(text, want) {
		t.Errorf("plan text lacks %q:\n%s", want, text)
	}
	out := b.mustRun(t, checked, "topology", "verify", "--config", b.config)
	if checked == cli.ExitOK && !strings.Contains(out, "verify: ok") {
		t.Errorf("verify:\n%s", out)
	}
}

func TestTopologyVerifyNamesMissingRetryQueue(t *testing.T) {
	t.Parallel()
	b := setupTopology(t, "")
	b.mustRun(t, cli.ExitOK, "topology", "apply", "--config", b.config)
	lane := config.RetryQueueName(b.work, 400*1e6, 0)
	ch := b.env.Channel("saboteur")
	if _, err := ch.QueueDelete(lane, false, false, false); err != nil {
		t.Fatal(err)
	}
	out := b.mustRun(t, cli.ExitFail, "topology", "verify", "--config", b.config)
	if !strings.Contains(out, "queue '"+lane+"': missing") {
		t.Errorf("verify does not name the deleted retry queue %s:\n%s", lane, out)
	}
	if strings.Contains(out, "queue '"+config.RetryQueueName(b.work, 200*1e6, 0)+"': missing") {
		t.Errorf("verify names a retry queue that exists:\n%s", out)
	}
}

func TestTopologyVerifyNamesDifferentDeliveryLimit(t *testing.T) {
	t.Parallel()
	b := setupTopology(t, "")
	b.mustRun(t, cli.ExitOK, "topology", "apply", "--config", b.config)
	// Redeclared elsewhere with another limit (same everything else).
	ch := b.env.Channel("saboteur")
	if _, err := ch.QueueDelete(b.work, false, false, false); err != nil {
		t.Fatal(err)
	}
	args := amqp.Table{
		"x-queue-type": "quorum", "x-dead-letter-exchange": config.DeadExchangeName(b.work),
		"x-delivery-limit": 9, "x-overflow": "reject-publish", "x-dead-letter-strategy": "at-least-once",
	}
	if _, err := ch.QueueDeclare(b.work, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	out := b.mustRun(t, cli.ExitFail, "topology", "verify", "--config", b.config)
	want := "queue '" + b.work + "': argument differs: x-delivery-limit: want 3, have 9"
	if !strings.Contains(out, want) {
		t.Errorf("verify output lacks %q:\n%s", want, out)
	}
	js := b.mustRun(t, cli.ExitFail, "topology", "verify", "--config", b.config, "--output", "json")
	var r topology.VerifyReport
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		t.Fatalf("verify JSON: %v\n%s", err, js)
	}
	found := false
	for _, p := range r.Problems {
		found = found || (p.Arg == "x-delivery-limit" && p.Want == "3" && p.Have == "9")
	}
	if !found {
		t.Errorf("JSON problems lack the delivery limit: %+v", r.Problems)
	}
	// Plan says apply would refuse: exit 1, not 0 (nor 3, incomplete,
	// without the management API), so `plan && apply` stops here.
	noMgmt := writeTopologyConfig(t, b.env, "http://127.0.0.1:1", "")
	for _, config := range []string{b.config, noMgmt.config} {
		out := b.mustRun(t, cli.ExitFail, "topology", "plan", "--config", config)
		if want := "CONFLICT  queue '" + b.work + "': x-delivery-limit: want 3, have 9"; !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
	// Apply refuses (exit 1), names the difference and deletes nothing.
	code, out, errOut := b.run(t, "topology", "apply", "--config", b.config)
	if code != cli.ExitFail || !strings.Contains(out, "x-delivery-limit: want 3, have 9") || !strings.Contains(errOut, "nothing was declared") {
		t.Errorf("apply over a conflict: exit %d\n%s\n%s", code, out, errOut)
	}
	if _, err := ch.QueueDeclarePassive(b.work, true, false, false, false, args); err != nil {
		t.Errorf("the conflicting queue was touched: %v", err)
	}
}

func TestTopologyTypoKeyExits2AndDeclaresNothing(t *testing.T) {
	t.Parallel()
	b := setupTopology(t, "tierz: [200ms]")
	for _, sub := range []string{"plan", "apply", "verify"} {
		code, out, errOut := b.run(t, "topology", sub, "--config", b.config)
		if code != cli.ExitUsage {
			t.Errorf("%s: exit %d, want %d", sub, code, cli.ExitUsage)
		}
		if want := `queues[0].retry.tierz: unknown key (did you mean "tiers"?)`; !strings.Contains(errOut, want) {
			t.Errorf("%s: stderr lacks %q:\n%s", sub, want, errOut)
		}
		if out != "" {
			t.Errorf("%s: printed a report for a bad config:\n%s", sub, out)
		}
	}
	ch := b.env.Channel("check")
	_, err := ch.QueueDeclarePassive(b.work, true, false, false, false, nil)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Fatalf("work queue exists after a rejected config (err %v)", err)
	}
}

func TestTopologyNeverPrintsThePassword(t *testing.T) {
	t.Parallel()
	b := setupTopology(t, "")
	u, err := url.Parse(b.env.URL)
	if err != nil {
		t.Fatal(err)
	}
	pass, _ := u.User.Password()
	secret := u.User.Username() + ":" + pass
	if pass == "" || !strings.Contains(b.env.URL, secret) {
		t.Skip("broker URL carries no password")
	}
	var outputs []string
	for _, args := range [][]string{
		{"topology", "plan", "--config", b.config, "--url", b.env.URL},
		{"topology", "apply", "--config", b.config, "--url", b.env.URL},
		{"topology", "verify", "--config", b.config, "--url", b.env.URL, "--output", "json"},
		{"topology", "verify", "--config", b.config, "--url", strings.Replace(b.env.URL, u.Host, "127.0.0.1:1", 1)},
		{"topology", "verify", "--config", b.config, "--url", "amqp://user:s3cr3t-pw@127.0.0.1:1/"},
		{"topology", "plan", "--config", b.config, "--url", "amqp://user:s3cr3t-pw@[::1"},
		{"topology", "plan", "-h"},
	} {
		code, out, errOut := b.run(t, args...)
		outputs = append(outputs, out, errOut)
		if strings.Contains(args[len(args)-1], ":1/") && code != cli.ExitFail {
			t.Errorf("%v: exit %d, want %d for an unreachable broker", args, code, cli.ExitFail)
		}
	}
	for _, o := range outputs {
		for _, s := range []string{secret, "s3cr3t-pw"} {
			if strings.Contains(o, s) {
				t.Errorf("output contains the password %q:\n%s", s, o)
			}
		}
	}
}

func TestTopologyBadUsage(t *testing.T) {
	t.Parallel()
	b := &topoBundle{}
	for _, args := range [][]string{
		{"topology"},
		{"topology", "destroy"},
		{"topology", "plan", "--output", "xml"},
		{"topology", "plan", "extra"},
		{"topology", "plan", "--config", filepath.Join(t.TempDir(), "missing.yaml")},
	} {
		if code, _, _ := b.run(t, args...); code != cli.ExitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, cli.ExitUsage)
		}
	}
}

// RABBITMQ_MANAGEMENT_URL stands in for broker.management_url: the config
// names one that does not answer, the variable the broker's, and verify
// checks everything.
func TestManagementURLFromTheEnvironment(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	mgmt := env.RequireManagement()
	b := writeTopologyConfig(t, env, "http://127.0.0.1:1", "")
	b.mustRun(t, cli.ExitOK, "topology", "apply", "--config", b.config)
	var out, errOut bytes.Buffer
	code := cli.Main(context.Background(), []string{"topology", "verify", "--config", b.config}, &cli.Env{Stdout: &out, Stderr: &errOut,
		Getenv: func(k string) string {
			switch k {
			case "RABBITMQ_URL":
				return env.URL
			case "RABBITMQ_MANAGEMENT_URL":
				return mgmt
			}
			return ""
		}})
	if code != cli.ExitOK {
		t.Fatalf("verify with $RABBITMQ_MANAGEMENT_URL exited %d, want 0:\n%s\n%s", code, out.String(), errOut.String())
	}
}

// With broker.management_url set but nothing answering there (the plugin
// not enabled, as with the shipped config on a bare broker), apply stays
// idempotent over AMQP alone, and plan and verify check what AMQP can, name
// what they could not, and exit ExitIncomplete rather than fail or pass.
func TestTopologyWithoutAnsweringManagementAPI(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	b := writeTopologyConfig(t, env, "http://127.0.0.1:1", "")
	_, errOut := b.mustRunAll(t, cli.ExitOK, "topology", "apply", "--config", b.config)
	if !strings.Contains(errOut, "management API") {
		t.Errorf("apply does not warn that the management API did not answer:\n%s", errOut)
	}
	second, _ := b.mustRunAll(t, cli.ExitOK, "topology", "apply", "--config", b.config)
	if !strings.Contains(second, "apply: 0 created, 9 unchanged") {
		t.Errorf("second apply changed something:\n%s", second)
	}
	plan, _ := b.mustRunAll(t, cli.ExitIncomplete, "topology", "plan", "--config", b.config)
	if !strings.Contains(plan, "not checked: ") || !strings.Contains(plan, "bindings") {
		t.Errorf("plan does not name the bindings it could not check:\n%s", plan)
	}
	js, _ := b.mustRunAll(t, cli.ExitIncomplete, "topology", "verify", "--config", b.config, "--output", "json")
	var r topology.VerifyReport
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		t.Fatalf("verify JSON: %v\n%s", err, js)
	}
	if len(r.Problems) != 0 || r.Management || r.ManagementError == "" || r.Objects != 9 {
		t.Errorf("verify: problems %v, management %v, management error %q, %d objects checked", r.Problems, r.Management, r.ManagementError, r.Objects)
	}
	for _, what := range []string{"bindings", "policies", "arguments"} {
		found := false
		for _, n := range r.NotChecked {
			found = found || strings.Contains(n, what)
		}
		if !found {
			t.Errorf("verify does not say it could not check %s: %q", what, r.NotChecked)
		}
	}
	// Drift AMQP can see still fails verify.
	lane := config.RetryQueueName(b.work, 200*time.Millisecond, 0)
	if _, err := b.env.Channel("saboteur").QueueDelete(lane, false, false, false); err != nil {
		t.Fatal(err)
	}
	out, _ := b.mustRunAll(t, cli.ExitFail, "topology", "verify", "--config", b.config)
	if !strings.Contains(out, "queue '"+lane+"': missing") {
		t.Errorf("verify does not name the deleted lane:\n%s", out)
	}
}

// The top-level usage says "Run 'dlxbridge <command> -h' for its flags":
// that must list the subcommands and exit 0, not fail as bad usage.
func TestCommandGroupHelp(t *testing.T) {
	t.Parallel()
	for _, group := range []struct {
		name string
		subs []string
	}{{"topology", []string{"plan", "apply", "verify"}}, {"schemas", []string{"list", "lint", "validate"}}} {
		for _, h := range []string{"-h", "--help", "help"} {
			code, out, errOut := runCLI(t, "", group.name, h)
			if code != cli.ExitOK || errOut != "" {
				t.Errorf("dlxbridge %s %s: exit %d, stderr %q; want %d and help on stdout (| less)", group.name, h, code, errOut, cli.ExitOK)
			}
			for _, sub := range group.subs {
				if !strings.Contains(out, "\n  "+sub+" ") {
					t.Errorf("dlxbridge %s %s does not describe %q:\n%s%s", group.name, h, sub, out, errOut)
				}
			}
		}
		if code, _, _ := runCLI(t, "", group.name); code != cli.ExitUsage {
			t.Errorf("dlxbridge %s: exit %d, want %d", group.name, code, cli.ExitUsage)
		}
	}
}

// A missing config file says so and how to name one.
func TestMissingConfigSaysHowToNameOne(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	env := &cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }}
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	if code := cli.Main(context.Background(), []string{"topology", "plan", "--config", missing}, env); code == cli.ExitOK {
		t.Fatalf("exit 0 without a config")
	}
	if want := "no config file " + missing + " (pass --config <file>"; !strings.Contains(errOut.String(), want) {
		t.Errorf("stderr %q lacks %q", errOut.String(), want)
	}
}

// Help that was asked for is the command's output, on stdout, exit 0;
// the usage printed after a mistake goes to stderr with exit 2.
func TestAskedForHelpGoesToStdout(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"topology", "plan", "-h"}, {"quarantine", "replay", "--help"}, {"audit", "-h"}, {"run", "-help"}, {"bench", "-h"}} {
		code, out, errOut := runCLI(t, "", args...)
		if code != cli.ExitOK || !strings.Contains(out, "usage: dlxbridge") || errOut != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d and the usage on stdout only", args, code, out, errOut, cli.ExitOK)
		}
	}
	for _, args := range [][]string{{}, {"nosuch"}, {"topology", "plan", "--nosuch"}, {"audit", "--nosuch"}, {"bench", "--nosuch"}} {
		code, out, errOut := runCLI(t, "", args...)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errOut, "usage: dlxbridge") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d and the usage on stderr only", args, code, out, errOut, cli.ExitUsage)
		}
	}
}
