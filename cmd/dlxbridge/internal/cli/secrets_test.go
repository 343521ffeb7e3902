package cli_test

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// runWith runs dlxbridge with args and RABBITMQ_URL set to rabbitURL.
func runWith(rabbitURL string, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	env := &cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
		if k == "RABBITMQ_URL" {
			return rabbitURL
		}
		return ""
	}}
	code = cli.Main(context.Background(), args, env)
	return code, out.String(), errOut.String()
}

// withManagementURL writes a copy of the bundle's config whose
// broker.management_url is mgmt.
func (b *topoBundle) withManagementURL(t *testing.T, mgmt string) string {
	t.Helper()
	doc, err := os.ReadFile(b.config)
	if err != nil {
		t.Fatal(err)
	}
	old := "management_url: " + strconv.Quote(b.env.ManagementURL)
	if !strings.Contains(string(doc), old) {
		t.Fatalf("config has no %s", old)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	doc = []byte(strings.Replace(string(doc), old, "management_url: "+strconv.Quote(mgmt), 1))
	if err := os.WriteFile(path, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A password that is not percent-encoded, in --url, in RABBITMQ_URL or in
// the config's broker.management_url, never shows in any command's output,
// and a command given such an AMQP URL fails.
func TestHostilePasswordsNeverReachOutput(t *testing.T) {
	t.Parallel()
	b := setupTopology(t, "")
	mgmt, err := url.Parse(b.env.RequireManagement())
	if err != nil {
		t.Fatal(err)
	}
	amqpHost, err := url.Parse(b.env.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range brokertest.HostileSecrets() {
		bad := brokertest.WithPassword("amqp", "leakuser", s.Password, amqpHost.Host+"/")
		badMgmt := b.withManagementURL(t, brokertest.WithPassword(mgmt.Scheme, "mgmtuser", s.Password, mgmt.Host))
		for _, run := range []struct {
			name      string
			rabbitURL string
			args      []string
			mustFail  bool
		}{
			{"--url", "", []string{"topology", "plan", "--config", b.config, "--url", bad}, true},
			{"RABBITMQ_URL", bad, []string{"topology", "apply", "--config", b.config}, true},
			{"RABBITMQ_URL, json", bad, []string{"topology", "verify", "--config", b.config, "--output", "json"}, true},
			{"management_url", b.env.URL, []string{"topology", "verify", "--config", badMgmt}, false},
			{"management_url, plan", b.env.URL, []string{"topology", "plan", "--config", badMgmt, "--output", "json"}, false},
		} {
			code, out, errOut := runWith(run.rabbitURL, run.args...)
			if run.mustFail && code == cli.ExitOK {
				t.Errorf("password %q via %s: exit 0, want a failure", s.Password, run.name)
			}
			s.Check(t, run.name+" stdout", out)
			s.Check(t, run.name+" stderr", errOut)
		}
	}
}

// A wrong password: exit 1 and a message that says the login was refused,
// without the password.
func TestWrongPasswordExitsOneAndSaysSo(t *testing.T) {
	t.Parallel()
	b := setupTopology(t, "")
	u, err := url.Parse(b.env.URL)
	if err != nil {
		t.Fatal(err)
	}
	const wrong = "n0t-the-pa55"
	u.User = url.UserPassword(u.User.Username(), wrong)
	code, out, errOut := runWith("", "topology", "plan", "--config", b.config, "--url", u.String())
	if code != cli.ExitFail {
		t.Errorf("exit %d, want %d", code, cli.ExitFail)
	}
	if !strings.Contains(errOut, "refused the login") || !strings.Contains(errOut, "user \""+u.User.Username()+"\"") {
		t.Errorf("stderr does not say the login was refused:\n%s", errOut)
	}
	if strings.Contains(out+errOut, wrong) {
		t.Errorf("output shows the password:\nstdout:\n%s\nstderr:\n%s", out, errOut)
	}
}
