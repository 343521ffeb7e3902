package cli_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
	"github.com/dlxbridge/dlxbridge/quarantine"
)

// export writes an archive and refuses a directory that is not empty;
// replay --from-archive sends its records (after the stream's are
// replayed, none is open there, and still the archive's are not sent
// twice); one changed byte in the archive refuses the replay (exit 1),
// naming the record; --to is required and --from-archive must name a
// directory (exit 2).
func TestQuarantineExportAndReplayFromArchive(t *testing.T) {
	t.Parallel()
	b, cfg := setupQuarantine(t, map[string]int{"fp-a": 3})
	cfgFlag := []string{"--config", b.config}
	run := func(code int, args ...string) string { return b.mustRun(t, code, append(args, cfgFlag...)...) }
	q := cfg.Queues[0].Name

	run(cli.ExitUsage, "quarantine", "export", "--queue", q)
	// A path that names no directory is a mistyped flag (exit 2), not an
	// archive refused for its manifest (exit 1).
	run(cli.ExitUsage, "quarantine", "replay", "--from-archive", filepath.Join(t.TempDir(), "nosuch"), "--queue", q, "--dry-run")
	dir := filepath.Join(t.TempDir(), "archive")
	var m quarantine.Manifest
	if err := json.Unmarshal([]byte(run(cli.ExitOK, "quarantine", "export", "--to", dir, "--queue", q, "--output", "json")), &m); err != nil {
		t.Fatal(err)
	}
	if m.Count != 3 || m.Vhost == "" || len(m.Quarantines) != 1 {
		t.Fatalf("manifest %+v", m)
	}
	if out := run(cli.ExitFail, "quarantine", "export", "--to", dir, "--queue", q); out != "" {
		t.Fatalf("a refused export printed %q", out)
	}
	dry := run(cli.ExitOK, "quarantine", "replay", "--from-archive", dir, "--queue", q, "--dry-run")
	if !strings.Contains(dry, "3 selected, 3 would be sent") {
		t.Fatalf("dry run from the archive:\n%s", dry)
	}

	tampered := filepath.Join(t.TempDir(), "tampered")
	if err := os.CopyFS(tampered, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	lines, _ := os.ReadFile(filepath.Join(tampered, "records.jsonl"))
	if err := os.WriteFile(filepath.Join(tampered, "records.jsonl"), bytes.Replace(lines, []byte(`"fp-a"`), []byte(`"fp-x"`), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut := b.mustRunAll(t, cli.ExitFail, append([]string{"quarantine", "replay", "--from-archive", tampered, "--queue", q}, cfgFlag...)...)
	if !strings.Contains(errOut, m.Records[0].ID) || !strings.Contains(errOut, "digest") {
		t.Fatalf("a tampered archive: %s", errOut)
	}

	out := run(cli.ExitOK, "quarantine", "replay", "--from-archive", dir, "--queue", q, "--reason", "from the archive")
	if !strings.Contains(out, "replayed 3 of 3 selected") {
		t.Fatalf("replay from the archive:\n%s", out)
	}
	if again := run(cli.ExitOK, "quarantine", "replay", "--from-archive", dir, "--queue", q, "--dry-run"); !strings.Contains(again, "0 selected") {
		t.Fatalf("the archive's records were selected again after their replay:\n%s", again)
	}
	if audit := run(cli.ExitOK, "quarantine", "audit", "--wide"); !strings.Contains(audit, "archive="+dir) {
		t.Errorf("the audit trail does not name the archive:\n%s", audit)
	}
}
