package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
)

// runCLI runs dlxbridge with args and stdin and returns exit code, stdout
// and stderr.
func runCLI(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Main(context.Background(), args, &cli.Env{
		Stdout: &out, Stderr: &errOut, Stdin: strings.NewReader(stdin),
		Getenv: func(string) string { return "" },
	})
	return code, out.String(), errOut.String()
}

const validOrderV1 = `{
  "orderId": "5f1c9b4e-8d3a-4f7e-9a1b-2c3d4e5f6a7b",
  "createdAt": "2026-11-29T19:13:25Z",
  "customer": {"id": "cus_8842", "email": "jane.doe@example.com"},
  "items": [{"sku": "BOOK-0042", "quantity": 1}],
  "totalCents": 3990
}`

// copyRegistry copies the repo's schemas/<type>/v<N>.json into a temp dir.
func copyRegistry(t *testing.T) string {
	t.Helper()
	src := filepath.Join("..", "..", "..", "..", "schemas")
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".json") || strings.Contains(p, "testdata") {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(rel)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestSchemasLint(t *testing.T) {
	t.Parallel()
	t.Run("shipped registry", func(t *testing.T) {
		t.Parallel()
		code, out, errOut := runCLI(t, "", "schemas", "lint")
		if code != cli.ExitOK || !strings.Contains(out, "ok: 6 schemas") {
			t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
		}
	})
	t.Run("copy of the registry alone", func(t *testing.T) {
		t.Parallel()
		dir := copyRegistry(t)
		code, out, errOut := runCLI(t, "", "schemas", "lint", "--no-embedded", "--dir", dir)
		if code != cli.ExitOK {
			t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
		}
	})
	t.Run("broken copy", func(t *testing.T) {
		t.Parallel()
		dir := copyRegistry(t)
		// One file breaks the meta-schema, one is not JSON, one refers to
		// a definition that does not exist.
		mustWrite(t, filepath.Join(dir, "orders.created", "v2.json"), `{"type": "objekt"}`)
		mustWrite(t, filepath.Join(dir, "orders.cancelled", "v1.json"), `{"type": "object",`)
		mustWrite(t, filepath.Join(dir, "notifications.sms", "v1.json"), `{"$ref": "../common/v1.json#/$defs/nope"}`)
		for _, args := range [][]string{
			{"schemas", "lint", "--no-embedded", "--dir", dir},
			{"schemas", "lint", "--dir", dir}, // on top of the embedded one
		} {
			code, out, errOut := runCLI(t, "", args...)
			if code != cli.ExitFail {
				t.Fatalf("%v: exit %d, want 1\nstdout: %s\nstderr: %s", args, code, out, errOut)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 3 {
				t.Fatalf("want 3 broken files listed, got:\n%s", out)
			}
			for i, name := range []string{"notifications.sms", "orders.cancelled", "orders.created"} {
				if !strings.HasPrefix(lines[i], filepath.Join(dir, name)) {
					t.Errorf("line %d = %q, want it to name %s", i, lines[i], name)
				}
			}
			if !strings.Contains(errOut, "3 broken file(s)") {
				t.Errorf("stderr: %s", errOut)
			}
		}
	})
	t.Run("missing dir", func(t *testing.T) {
		t.Parallel()
		if code, _, _ := runCLI(t, "", "schemas", "lint", "--dir", filepath.Join(t.TempDir(), "nope")); code != cli.ExitUsage {
			t.Fatalf("exit %d, want 2", code)
		}
	})
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSchemasValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	valid := filepath.Join(dir, "valid.json")
	mustWrite(t, valid, validOrderV1)
	invalid := filepath.Join(dir, "invalid.json")
	mustWrite(t, invalid, strings.NewReplacer(`"jane.doe@example.com"`, `"jane"`, `3990`, `-1`).Replace(validOrderV1))

	tests := []struct {
		name  string
		stdin string
		args  []string
		code  int
		out   []string // substrings of stdout
	}{
		{"valid file", "", []string{"--type", "orders.created", "--version", "1", valid}, cli.ExitOK, []string{"valid: orders.created v1"}},
		{"valid stdin", validOrderV1, []string{"--type", "orders.created", "--version", "v1", "-"}, cli.ExitOK, []string{"valid: orders.created v1"}},
		{"latest version by default", validOrderV1, []string{"--type", "orders.created", "-"}, cli.ExitFail, []string{"(root) required: missing properties"}},
		{"invalid file", "", []string{"--type", "orders.created", "--version", "1", invalid}, cli.ExitFail, []string{
			"/customer/email format: value is not valid 'email'",
			"/totalCents minimum: must be >= 0\n",
		}},
		{"invalid stdin", `{"orderId":1,"orderId":2}`, []string{"--type", "orders.created", "--version", "1", "-"}, cli.ExitFail, []string{"decode: duplicate object key at /orderId"}},
		{"not JSON", `hello`, []string{"--type", "orders.cancelled", "-"}, cli.ExitFail, []string{"decode: invalid character"}},
		{"too large", validOrderV1, []string{"--type", "orders.created", "--max-body-bytes", "10", "-"}, cli.ExitFail, []string{"too_large"}},
		{"no type", validOrderV1, []string{"-"}, cli.ExitUsage, nil},
		{"no file", "", []string{"--type", "orders.created"}, cli.ExitUsage, nil},
		{"unknown type", "", []string{"--type", "orders.shipped", valid}, cli.ExitUsage, nil},
		{"unknown version", "", []string{"--type", "orders.created", "--version", "7", valid}, cli.ExitUsage, nil},
		{"missing file", "", []string{"--type", "orders.created", filepath.Join(dir, "nope.json")}, cli.ExitUsage, nil},
	}
	// What stderr says, by test name: what is missing, and the verdict
	// without the reason repeated.
	stderr := map[string]string{
		"no type":      "--type is required",
		"no file":      "one body to validate",
		"invalid file": "schemas validate: invalid orders.created v1\n",
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := runCLI(t, tt.stdin, append([]string{"schemas", "validate"}, tt.args...)...)
			if want := stderr[tt.name]; !strings.Contains(errOut, want) {
				t.Errorf("stderr lacks %q:\n%s", want, errOut)
			}
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out, errOut)
			}
			for _, want := range tt.out {
				if !strings.Contains(out, want) {
					t.Errorf("stdout lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

func TestSchemasList(t *testing.T) {
	t.Parallel()
	code, out, _ := runCLI(t, "", "schemas", "list")
	if code != cli.ExitOK || !strings.Contains(out, "orders.created") || !strings.HasPrefix(out, "TYPE") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	// common/v1.json holds shared $defs, not a message type: it is listed
	// apart.
	types, defs, found := strings.Cut(out, "\n\n")
	if !found || strings.Contains(types, "common") || !strings.HasPrefix(defs, "DEFINITIONS") || !strings.Contains(defs, "common ") {
		t.Errorf("common is listed as a message type, or not as definitions:\n%s", out)
	}
	code, out, _ = runCLI(t, "", "schemas", "list", "--output", "json")
	var refs []struct{ Type, Version, Source, Kind string }
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &refs) != nil || len(refs) != 6 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if refs[5].Type != "orders.created" || refs[5].Version != "2" {
		t.Errorf("last ref %+v, want orders.created v2", refs[5])
	}
	for _, r := range refs {
		if want := map[bool]string{true: "definitions", false: "message"}[r.Type == "common"]; r.Kind != want {
			t.Errorf("%s v%s: kind %q, want %q", r.Type, r.Version, r.Kind, want)
		}
	}
	if code, _, _ := runCLI(t, "", "schemas", "list", "--output", "yaml"); code != cli.ExitUsage {
		t.Errorf("--output yaml: exit %d, want 2", code)
	}
	if code, _, _ := runCLI(t, "", "schemas", "frobnicate"); code != cli.ExitUsage {
		t.Errorf("unknown subcommand: exit %d, want 2", code)
	}
}
