package wire

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// notHeaders are literals that look like header names but name something
// else.
var notHeaders = map[string]bool{
	"dlxbridge-brokertest": true, // the test harness's journal directory
	"dlxbridge-demo-":      true, // the demo's name prefix
	"dlxbridge-demo":       true, // the demo publisher's app id
}

// headerLike: a literal that reads like a header name of the bridge's or the
// broker's dead-letter family.
var headerLike = regexp.MustCompile(`^(dlxbridge-|x-death|x-delivery-count|x-acquired-count|x-first-death-|x-last-death-)[a-z0-9-]*$`)

// TestNoHeaderNameOutsideWire holds the module to one home for the wire
// contract: no .go file outside this package spells a header name the
// bridge reads or writes. Tests are exempt on purpose: a test that spells a
// name is what notices when a constant here changes the contract.
func TestNoHeaderNameOutsideWire(t *testing.T) {
	t.Parallel()
	known := headerNames(t)
	if len(known) < 30 {
		t.Fatalf("read only %d header names from headers.go", len(known))
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			// httpconsumer stands for the sidecar's application in any
			// language: it reads the HTTP headers by name, as one would.
			case "wire", "testdata", ".git", "node_modules", "httpconsumer":
				if path != root {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil || notHeaders[s] {
				return true
			}
			if known[s] || headerLike.MatchString(s) {
				t.Errorf("%s: header name %q spelled out; use package wire's constant", fset.Position(lit.Pos()), s)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files under %s", checked, root)
	}
}

// TestHeaderLiteralCheckCatches proves the check can fail.
func TestHeaderLiteralCheckCatches(t *testing.T) {
	t.Parallel()
	known := headerNames(t)
	for _, s := range []string{"dlxbridge-attempts", "x-death", "x-first-death-queue", "traceparent", "idempotency-key", "schema-version", "dlxbridge-new-thing"} {
		if !known[s] && !headerLike.MatchString(s) {
			t.Errorf("%q is not caught", s)
		}
	}
	for _, s := range []string{"x-death[%d]: skipped", "dlxbridge-%s-%s-%d", "queue", "x-queue-type"} {
		if known[s] || headerLike.MatchString(s) {
			t.Errorf("%q is caught but names no header", s)
		}
	}
}

// headerNames evaluates headers.go's string constants (literals and sums of
// constants and literals), except the x-death entry's field names, which are
// common words.
func headerNames(t *testing.T) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "headers.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]string{}
	var eval func(e ast.Expr) (string, bool)
	eval = func(e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.Ident:
			s, ok := vals[e.Name]
			return s, ok
		case *ast.BinaryExpr:
			a, ok1 := eval(e.X)
			b, ok2 := eval(e.Y)
			return a + b, ok1 && ok2 && e.Op == token.ADD
		}
		return "", false
	}
	known := map[string]bool{}
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				s, ok := eval(vs.Values[i])
				if !ok {
					t.Fatalf("headers.go: can't read %s", name.Name)
				}
				vals[name.Name] = s
				if !strings.HasPrefix(name.Name, "XDeath") && !strings.HasSuffix(name.Name, "Prefix") {
					known[s] = true
				}
			}
		}
	}
	return known
}
