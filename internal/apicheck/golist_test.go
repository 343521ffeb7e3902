package apicheck

import (
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// pkg is the part of `go list -json` the checks read.
type pkg struct {
	Dir        string
	ImportPath string
	Name       string
	GoFiles    []string
	Export     string
	Imports    []string
	Deps       []string
	Standard   bool
	Module     *struct{ Path, Dir string }
}

// goList runs `go list -json args...` in the module root and decodes every
// package it prints.
func goList(t *testing.T, args ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = moduleRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// moduleRoot is the directory of dlxbridge's go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == "/dev/null" {
		t.Fatal("not inside dlxbridge's module")
	}
	return strings.TrimSuffix(gomod, "/go.mod")
}

const module = "github.com/dlxbridge/dlxbridge"

// isInternal reports whether an import path has an internal element, which
// no other module may import.
func isInternal(path string) bool {
	for _, el := range strings.Split(path, "/") {
		if el == "internal" {
			return true
		}
	}
	return false
}

// publicPackages are the module's packages other modules can import: not
// internal, not a command, not an example.
func publicPackages(t *testing.T) []pkg {
	t.Helper()
	var pub []pkg
	for _, p := range goList(t, "./...") {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if isInternal(p.ImportPath) || p.Name == "main" || strings.HasPrefix(rel, "cmd/") || strings.HasPrefix(rel, "examples/") {
			continue
		}
		pub = append(pub, p)
	}
	if len(pub) == 0 {
		t.Fatal("no public packages found")
	}
	return pub
}
