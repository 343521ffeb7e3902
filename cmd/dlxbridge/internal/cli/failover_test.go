package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// RABBITMQ_URL (or --url) lists two nodes and the first is down:
// `topology verify` and `quarantine list` work on the second and say on
// stderr which node they reached. RABBITMQ_MANAGEMENT_URL lists the APIs
// likewise, the first down too, and verify still checks everything.
func TestCommandsFailOverToTheNextNode(t *testing.T) {
	t.Parallel()
	b, _ := setupQuarantine(t, map[string]int{"fp-a": 2})
	list := "amqp://guest:guest@127.0.0.1:1/," + b.env.URL
	mgmt := ""
	if b.env.ManagementURL != "" {
		mgmt = "http://127.0.0.1:1," + b.env.ManagementURL
	}
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		env := &cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
			switch k {
			case "RABBITMQ_URL":
				return list
			case "RABBITMQ_MANAGEMENT_URL":
				return mgmt
			}
			return ""
		}}
		code := cli.Main(context.Background(), append(args, "--config", b.config), env)
		return code, out.String(), errOut.String()
	}
	ep, err := amqpx.ParseAMQPURL(b.env.URL)
	if err != nil {
		t.Fatal(err)
	}
	addr := amqpx.Node{Endpoint: ep}.Addr()
	saysNode := func(what, stderr string) {
		t.Helper()
		for _, s := range []string{`msg="node did not answer; trying the next" node=127.0.0.1:1`, "msg=connected node=" + addr + " cluster="} {
			if !strings.Contains(stderr, s) {
				t.Errorf("%s: stderr lacks %q:\n%s", what, s, stderr)
			}
		}
		if strings.Contains(stderr, "guest:guest") {
			t.Errorf("%s: stderr shows a password:\n%s", what, stderr)
		}
	}

	want := cli.ExitOK
	if mgmt == "" {
		want = cli.ExitIncomplete // no management API: verify says what it could not check
	}
	code, out, stderr := run("topology", "verify")
	if code != want {
		t.Fatalf("topology verify: exit %d, want %d\n%s\n%s", code, want, out, stderr)
	}
	saysNode("topology verify", stderr)
	if mgmt != "" && strings.Contains(stderr, "warning") {
		t.Errorf("verify could not use the second management API:\n%s", stderr)
	}

	code, out, stderr = run("quarantine", "list", "--output", "json")
	if code != cli.ExitOK {
		t.Fatalf("quarantine list: exit %d\n%s\n%s", code, out, stderr)
	}
	saysNode("quarantine list", stderr)
	var l struct {
		Total int `json:"total"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil || l.Total != 2 {
		t.Errorf("quarantine list: %v, total %d, want 2:\n%s", err, l.Total, out)
	}

	// --url takes the same list, and a single URL says nothing about nodes.
	code, _, stderr = run("quarantine", "list", "--url", list)
	if code != cli.ExitOK {
		t.Fatalf("quarantine list --url: exit %d\n%s", code, stderr)
	}
	saysNode("quarantine list --url", stderr)
	if code, _, stderr = run("quarantine", "list", "--url", b.env.URL); code != cli.ExitOK || strings.Contains(stderr, "msg=connected") {
		t.Errorf("one URL: exit %d, stderr:\n%s", code, stderr)
	}
}

// A list with a bad entry is refused before anything connects, naming the
// entry by position, quoting nothing of it.
func TestCommandsRefuseABadURLList(t *testing.T) {
	t.Parallel()
	b := &topoBundle{}
	for _, c := range []struct{ url, says string }{
		{"amqp://u:s3cr3t@127.0.0.1:1/,", "AMQP URL 2 of 2 (empty"},
		{"amqp://u:s3cr3t@n1/a,amqp://u:s3cr3t@n2/b", "must name the same one"},
		{"amqp://u:s3cr3t@n1:5672,n2:5672/", "each with its scheme"},
	} {
		code, _, stderr := b.run(t, "topology", "verify", "--config", "../../../../config.yaml", "--url", c.url)
		if code != cli.ExitUsage || !strings.Contains(stderr, c.says) || strings.Contains(stderr, "s3cr3t") {
			t.Errorf("%s: exit %d, stderr %q; want %d saying %q", c.url, code, stderr, cli.ExitUsage, c.says)
		}
	}
}
