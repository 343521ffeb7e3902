package cli_test

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	run := func(args ...string) (int, string, string) { return runCLI(t, "", args...) }
	code, out, _ := run("version")
	if code != cli.ExitOK || !strings.HasPrefix(out, "dlxbridge ") || !strings.Contains(out, runtime.Version()) {
		t.Fatalf("version: exit %d, %q", code, out)
	}
	if code, alias, _ := run("--version"); code != cli.ExitOK || alias != out {
		t.Fatalf("--version: exit %d, %q, want %q", code, alias, out)
	}
	code, out, _ = run("version", "--output", "json")
	var v map[string]any
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &v) != nil || v["go"] != runtime.Version() || v["module"] != "github.com/dlxbridge/dlxbridge" {
		t.Fatalf("version --output json: exit %d, %q", code, out)
	}
	if code, _, errOut := run("version", "--output", "yaml"); code != cli.ExitUsage || !strings.Contains(errOut, "text or json") {
		t.Fatalf("bad --output: exit %d, %q", code, errOut)
	}
	if code, _, errOut := run("version", "now"); code != cli.ExitUsage || !strings.Contains(errOut, `"now"`) {
		t.Fatalf("extra argument: exit %d, %q", code, errOut)
	}
}
