package apicheck

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Another module cannot name a type under internal/, so an exported
// identifier whose type, field, parameter, result or method mentions one is
// an API that only this module can use (consumer.Config.File was a
// *internal/config.Config). The check reads the compiler's export data of
// each public package, which holds exactly what other modules see.
func TestPublicAPIMentionsNoInternalType(t *testing.T) {
	t.Parallel()
	for _, tp := range publicExports(t) {
		w := &walker{seen: map[*types.Named]bool{}}
		w.pkg(tp)
		for _, f := range w.found {
			t.Errorf("%s", f)
		}
	}
}

// publicExports imports every public package from the compiler's export
// data, in import-path order.
func publicExports(t *testing.T) []*types.Package {
	t.Helper()
	pub := publicPackages(t)
	args := []string{"-export", "-deps"}
	for _, p := range pub {
		args = append(args, p.ImportPath)
	}
	exports := map[string]string{}
	for _, p := range goList(t, args...) {
		exports[p.ImportPath] = p.Export
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	var out []*types.Package
	for _, p := range pub {
		tp, err := imp.Import(p.ImportPath)
		if err != nil {
			t.Fatalf("import %s: %v", p.ImportPath, err)
		}
		out = append(out, tp)
	}
	return out
}

// walker collects every place an exported API of one package mentions an
// internal type.
type walker struct {
	seen  map[*types.Named]bool
	found []string
}

func (w *walker) pkg(p *types.Package) {
	scope := p.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		where := p.Name() + "." + name
		switch obj := obj.(type) {
		case *types.TypeName:
			if n, ok := obj.Type().(*types.Named); ok && !obj.IsAlias() {
				w.seen[n] = true
				w.named(where, n)
			} else {
				w.typ(where, obj.Type())
			}
		default: // *types.Func, *types.Var, *types.Const
			w.typ(where, obj.Type())
		}
	}
}

// named walks a defined type's structure, type parameters and method set
// (promoted methods included).
func (w *walker) named(where string, n *types.Named) {
	w.typeParams(where, n.TypeParams())
	w.typ(where, n.Underlying())
	ms := types.NewMethodSet(types.NewPointer(n))
	for i := 0; i < ms.Len(); i++ {
		if m := ms.At(i).Obj(); m.Exported() {
			w.typ(where+"."+m.Name(), m.Type())
		}
	}
}

func (w *walker) typeParams(where string, tps *types.TypeParamList) {
	for i := 0; i < tps.Len(); i++ {
		w.typ(where, tps.At(i).Constraint())
	}
}

func (w *walker) typ(where string, t types.Type) {
	switch t := t.(type) {
	case *types.Alias:
		w.typ(where, types.Unalias(t))
	case *types.Named:
		obj := t.Obj()
		if obj.Pkg() == nil {
			return // error, comparable
		}
		if isInternal(obj.Pkg().Path()) {
			w.found = append(w.found, fmt.Sprintf("%s mentions %s.%s, which another module cannot name", where, obj.Pkg().Path(), obj.Name()))
			return
		}
		for i := 0; i < t.TypeArgs().Len(); i++ {
			w.typ(where, t.TypeArgs().At(i))
		}
		// An unexported type of this module reached from the API (a result,
		// an embedded field) shows its exported fields and methods too.
		// Exported ones are walked as their own package's API.
		if !obj.Exported() && strings.HasPrefix(obj.Pkg().Path(), module) && !w.seen[t] {
			w.seen[t] = true
			w.named(where, t)
		}
	case *types.Pointer:
		w.typ(where, t.Elem())
	case *types.Slice:
		w.typ(where, t.Elem())
	case *types.Array:
		w.typ(where, t.Elem())
	case *types.Chan:
		w.typ(where, t.Elem())
	case *types.Map:
		w.typ(where, t.Key())
		w.typ(where, t.Elem())
	case *types.Signature:
		w.typeParams(where, t.TypeParams())
		for _, tuple := range []*types.Tuple{t.Params(), t.Results()} {
			for i := 0; i < tuple.Len(); i++ {
				w.typ(where, tuple.At(i).Type())
			}
		}
	case *types.Struct:
		for i := 0; i < t.NumFields(); i++ {
			// Embedded fields count even when unexported: their exported
			// fields and methods are promoted.
			if f := t.Field(i); f.Exported() || f.Embedded() {
				w.typ(where+"."+f.Name(), f.Type())
			}
		}
	case *types.Interface:
		for i := 0; i < t.NumMethods(); i++ {
			if m := t.Method(i); m.Exported() {
				w.typ(where+"."+m.Name(), m.Type())
			}
		}
		for i := 0; i < t.NumEmbeddeds(); i++ {
			w.typ(where, t.EmbeddedType(i))
		}
	case *types.Union:
		for i := 0; i < t.Len(); i++ {
			w.typ(where, t.Term(i).Type())
		}
	case *types.TypeParam:
		w.typ(where, t.Constraint())
	}
}

// Documentation is API too: an exported identifier whose comment tells users
// to match an error or call a function of an internal package (publisher
// documented errors wrapping amqpx.ErrUnroutable) sends them to something
// they cannot import.
func TestPublicDocsNameNoInternalIdentifier(t *testing.T) {
	t.Parallel()
	var names []string
	for _, p := range goList(t, "./internal/...") {
		names = append(names, regexp.QuoteMeta(p.Name))
	}
	slices.Sort(names)
	names = slices.Compact(names)
	mention := regexp.MustCompile(`\b(` + strings.Join(names, "|") + `)\.[A-Z]\w*`)
	for _, p := range publicPackages(t) {
		fset := token.NewFileSet()
		for _, name := range p.GoFiles {
			path := filepath.Join(p.Dir, name)
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			for _, cg := range exportedDocs(f) {
				for _, m := range mention.FindAllString(cg.Text(), -1) {
					t.Errorf("%s: the doc of an exported identifier names %s, which lives under internal/", fset.Position(cg.Pos()), m)
				}
			}
		}
	}
}

// exportedDocs returns the comments of a file's package clause and of its
// exported declarations, fields and interface methods.
func exportedDocs(f *ast.File) []*ast.CommentGroup {
	var docs []*ast.CommentGroup
	add := func(cgs ...*ast.CommentGroup) {
		for _, cg := range cgs {
			if cg != nil {
				docs = append(docs, cg)
			}
		}
	}
	var fields func(ast.Expr)
	fields = func(e ast.Expr) {
		var list *ast.FieldList
		switch e := e.(type) {
		case *ast.StructType:
			list = e.Fields
		case *ast.InterfaceType:
			list = e.Methods
		default:
			return
		}
		for _, fl := range list.List {
			exported := len(fl.Names) == 0 // embedded
			for _, n := range fl.Names {
				exported = exported || n.IsExported()
			}
			if exported {
				add(fl.Doc, fl.Comment)
				fields(fl.Type)
			}
		}
	}
	add(f.Doc)
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv != nil && !exportedReceiver(d.Recv.List[0].Type) {
				continue
			}
			add(d.Doc)
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						add(d.Doc, s.Doc, s.Comment)
						fields(s.Type)
					}
				case *ast.ValueSpec:
					if slices.ContainsFunc(s.Names, (*ast.Ident).IsExported) {
						add(d.Doc, s.Doc, s.Comment)
					}
				}
			}
		}
	}
	return docs
}

func exportedReceiver(e ast.Expr) bool {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}
