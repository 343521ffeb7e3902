package cli_test

import (
	"net"
	"regexp"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// The management URL may list one API per node (broker.management_url,
// $RABBITMQ_MANAGEMENT_URL, --management-url): with the first node down,
// the audit reads the next one, as plan and verify do.
func TestAuditFailsOverToTheNextManagementNode(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	env.RequireManagement()
	// A port nothing listens on: the first node is down.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String()
	_ = l.Close()
	first := strings.SplitN(env.ManagementURL, ",", 2)[0]
	vars := map[string]string{"RABBITMQ_URL": env.URL, "RABBITMQ_MANAGEMENT_URL": down + "," + first}
	code, out, errOut := runAudit(t, vars, "--match", "^"+regexp.QuoteMeta(env.Prefix), "--output", "json", "--fail-on", "none")
	if code != cli.ExitOK {
		t.Fatalf("audit with the first of two management nodes down: exit %d\n%s\n%s", code, out, errOut)
	}
	if r := auditJSON(t, out); !r.Complete() {
		t.Errorf("incomplete: %v", r.NotChecked)
	}
}
