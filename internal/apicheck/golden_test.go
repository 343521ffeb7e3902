package apicheck

import (
	"bytes"
	"flag"
	"fmt"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite api/dlxbridge.txt from the current exported API")

// goldenAPI is the exported API of the public packages, one line per
// identifier, field and method, as Go's own api/*.txt files list it.
const goldenAPI = "api/dlxbridge.txt"

// The exported API is a contract: any change to it, an addition included,
// shows up here as a diff to review, not as a side effect of a refactor.
func TestExportedAPIMatchesGolden(t *testing.T) {
	var lines []string
	for _, p := range publicExports(t) {
		lines = append(lines, apiLines(p)...)
	}
	slices.Sort(lines)
	got := strings.Join(lines, "\n") + "\n"
	path := filepath.Join(moduleRoot(t), goldenAPI)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (write it with: go test ./internal/apicheck -run TestExportedAPIMatchesGolden -update)", err)
	}
	if d := lineDiff(strings.Split(strings.TrimSuffix(string(want), "\n"), "\n"), lines); d != "" {
		t.Errorf("the exported API differs from %s (- there, + now):\n%s\nIf the change is meant, review it and rewrite the file with:\n\tgo test ./internal/apicheck -run TestExportedAPIMatchesGolden -update", goldenAPI, d)
	}
}

// lineDiff lists the lines only in want (-) and only in got (+); both are
// sorted sets.
func lineDiff(want, got []string) string {
	in := func(s []string, l string) bool { _, ok := slices.BinarySearch(s, l); return ok }
	var b strings.Builder
	for _, l := range want {
		if !in(got, l) {
			fmt.Fprintf(&b, "-%s\n", l)
		}
	}
	for _, l := range got {
		if !in(want, l) {
			fmt.Fprintf(&b, "+%s\n", l)
		}
	}
	return b.String()
}

// apiLines lists one package's exported API.
func apiLines(p *types.Package) []string {
	qual := func(o *types.Package) string {
		if o == p {
			return ""
		}
		return o.Name()
	}
	typ := func(t types.Type) string { return types.TypeString(t, qual) }
	// Parameter names are not API (Go's api files leave them out too).
	unnamed := func(t *types.Tuple) *types.Tuple {
		vs := make([]*types.Var, t.Len())
		for i := range t.Len() {
			vs[i] = types.NewParam(t.At(i).Pos(), t.At(i).Pkg(), "", t.At(i).Type())
		}
		return types.NewTuple(vs...)
	}
	sig := func(s *types.Signature) string {
		var b bytes.Buffer
		types.WriteSignature(&b, types.NewSignatureType(nil, nil, nil, unnamed(s.Params()), unnamed(s.Results()), s.Variadic()), qual)
		return b.String()
	}
	prefix := "pkg " + strings.TrimPrefix(p.Path(), module+"/") + ", "
	var out []string
	add := func(format string, args ...any) { out = append(out, prefix+fmt.Sprintf(format, args...)) }
	scope := p.Scope()
	for _, name := range scope.Names() {
		switch obj := scope.Lookup(name).(type) {
		case *types.Const:
			if obj.Exported() {
				add("const %s %s = %s", name, typ(obj.Type()), obj.Val().ExactString())
			}
		case *types.Var:
			if obj.Exported() {
				add("var %s %s", name, typ(obj.Type()))
			}
		case *types.Func:
			if obj.Exported() {
				add("func %s%s", name, sig(obj.Type().(*types.Signature)))
			}
		case *types.TypeName:
			if !obj.Exported() {
				continue
			}
			if obj.IsAlias() {
				add("type %s = %s", name, typ(obj.Type()))
				continue
			}
			n := obj.Type().(*types.Named)
			head := name + typeParams(n.TypeParams(), typ)
			switch u := n.Underlying().(type) {
			case *types.Struct:
				add("type %s struct", head)
				for i := range u.NumFields() {
					f := u.Field(i)
					switch {
					case f.Embedded():
						add("type %s struct, embedded %s", head, typ(f.Type()))
					case f.Exported():
						add("type %s struct, %s %s", head, f.Name(), typ(f.Type()))
					}
				}
			case *types.Interface:
				add("type %s interface", head)
				for i := range u.NumExplicitMethods() {
					if m := u.ExplicitMethod(i); m.Exported() {
						add("type %s interface, %s%s", head, m.Name(), sig(m.Type().(*types.Signature)))
					}
				}
				for i := range u.NumEmbeddeds() {
					add("type %s interface, embedded %s", head, typ(u.EmbeddedType(i)))
				}
			default:
				add("type %s %s", head, typ(u))
			}
			for i := range n.NumMethods() {
				m := n.Method(i)
				if !m.Exported() {
					continue
				}
				s := m.Type().(*types.Signature)
				add("method (%s) %s%s", typ(s.Recv().Type()), m.Name(), sig(s))
			}
		}
	}
	return out
}

func typeParams(tps *types.TypeParamList, typ func(types.Type) string) string {
	if tps.Len() == 0 {
		return ""
	}
	var ps []string
	for i := range tps.Len() {
		ps = append(ps, tps.At(i).Obj().Name()+" "+typ(tps.At(i).Constraint()))
	}
	return "[" + strings.Join(ps, ", ") + "]"
}
