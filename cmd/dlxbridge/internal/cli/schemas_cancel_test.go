package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
)

// `schemas validate` stops when its context ends (SIGTERM or SIGINT, in
// main) instead of running a CPU-bound check to its end: here a pattern
// just under the size bound against a long string, seconds of CPU.
func TestSchemasValidateStopsWhenCancelled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "slow"), 0o755); err != nil {
		t.Fatal(err)
	}
	schema := `{"type": "object", "properties": {"s": {"type": "string", "pattern": "(` + strings.TrimSuffix(strings.Repeat("[a-y]{0,90}|", 8), "|") + `)z"}}}`
	if err := os.WriteFile(filepath.Join(dir, "slow", "v1.json"), []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	body := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(body, []byte(`{"s": "`+strings.Repeat("a", 60_000)+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var out, errOut bytes.Buffer
	start := time.Now()
	code := cli.Main(ctx, []string{"schemas", "validate", "--dir", dir, "--no-embedded", "--type", "slow", body},
		&cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }})
	took := time.Since(start)
	if code != cli.ExitFail || !strings.Contains(errOut.String(), "stopped before the check finished") || took > 3*time.Second {
		t.Errorf("exit %d after %s, stdout %q, stderr %q; want exit %d soon after the context ends", code, took, out.String(), errOut.String(), cli.ExitFail)
	}
}
