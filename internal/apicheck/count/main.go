// Command count prints how many top-level identifiers each public package
// exports (funcs, types, consts and vars; not methods or fields), the
// figure the golden file api/dlxbridge.txt is kept small by:
//
//	go run ./internal/apicheck/count
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
)

// public are the module's public packages, as internal/apicheck ranks them.
var public = []string{"wire", "schemas", "triage", "config", "topology", "quarantine", "publisher", "consumer"}

func main() {
	total := 0
	for _, dir := range public {
		n, err := count(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%-11s %4d\n", dir, n)
		total += n
	}
	fmt.Printf("%-11s %4d\n", "total", total)
}

func count(dir string) (int, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return 0, err
	}
	n := 0
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return 0, err
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					n++
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							n++
						}
					case *ast.ValueSpec:
						for _, id := range s.Names {
							if id.IsExported() {
								n++
							}
						}
					}
				}
			}
		}
	}
	return n, nil
}
