package schemas

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v5"
)

// embedded is the registry shipped in the binary.
//
//go:embed */*.json
var embedded embed.FS

// baseURL is where every schema lives as a resource: <type>/v<N>.json under
// it is its $id, and a $ref between files is relative to it (e.g.
// "../common/v1.json#/$defs/money"). Nothing is ever fetched from it.
const baseURL = "https://dlxbridge.dev/schemas/"

// URL returns the canonical $id of a type's schema version.
func URL(typ, version string) string {
	return baseURL + typ + "/v" + version + ".json"
}

// Ref names one schema in the registry.
type Ref struct {
	Type    string `json:"type"`
	Version string `json:"version"`
	// Source is where the file came from: "embedded:<type>/v<N>.json" or a
	// path under LoadOptions.Dir.
	Source string `json:"source"`
	// Kind is KindMessage, or KindDefinitions for a file that only holds
	// shared definitions (see Definitions).
	Kind string `json:"kind"`
}

// Kinds of schema file.
const (
	// KindMessage: the schema of a message type's version.
	KindMessage = "message"
	// KindDefinitions: shared definitions that message schemas $ref, such
	// as common/v1.json; not a message type.
	KindDefinitions = "definitions"
)

// annotationKeywords assert nothing about an instance.
var annotationKeywords = map[string]bool{
	"$schema": true, "$id": true, "$comment": true, "$anchor": true, "$dynamicAnchor": true, "$vocabulary": true,
	"$defs": true, "definitions": true,
	"title": true, "description": true, "examples": true, "default": true, "deprecated": true, "readOnly": true, "writeOnly": true,
}

// isDefinitions reports whether a schema file only holds shared definitions:
// its root has "$defs" (or "definitions") and nothing that asserts anything
// about an instance. Such a schema accepts every message, so it is a
// library for $refs, never a message type.
func isDefinitions(data []byte) bool {
	var root map[string]json.RawMessage
	if json.Unmarshal(data, &root) != nil {
		return false
	}
	_, defs := root["$defs"]
	_, legacy := root["definitions"]
	if !defs && !legacy {
		return false
	}
	for k := range root {
		if !annotationKeywords[k] {
			return false
		}
	}
	return true
}

// LoadOptions says where the registry comes from.
type LoadOptions struct {
	// Dir is a directory laid out like the embedded registry
	// (<type>/v<N>.json), loaded on top of it: a file here replaces the
	// embedded one with the same type and version. Defaults to "" (embedded
	// only).
	Dir string
	// NoEmbedded leaves out the embedded registry, e.g. to lint a directory
	// on its own. Defaults to false.
	NoEmbedded bool
}

// Registry holds every compiled schema. It is immutable once loaded and safe
// for concurrent use.
type Registry struct {
	schemas map[string]*jsonschema.Schema // key: type + "\x00" + version
	refs    []Ref
	latest  map[string]string
	// fast holds the fast path of each schema that has one (see
	// fastSchema); noFast says why the others have none.
	fast   map[*jsonschema.Schema]*fastSchema
	noFast map[*jsonschema.Schema]error
	// inv holds the invalid path of each schema with a fast path (see
	// vnode).
	inv map[*jsonschema.Schema]*vnode
	// bound is the largest pattern program each schema holds (see
	// patternBound): what validating a value with jsonschema may run.
	bound map[*jsonschema.Schema]int
}

// FileError is one schema file that failed to load or compile.
type FileError struct {
	Source string
	Err    error
}

func (e FileError) Error() string { return e.Source + ": " + e.Err.Error() }

// LoadError lists every broken file; Load returns it and no registry.
type LoadError struct {
	Files []FileError
}

func (e *LoadError) Error() string {
	lines := make([]string, len(e.Files))
	for i, f := range e.Files {
		lines[i] = f.Error()
	}
	return fmt.Sprintf("schema registry: %d broken file(s):\n  %s", len(e.Files), strings.Join(lines, "\n  "))
}

var (
	typeRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$`)
	versionRE = regexp.MustCompile(`^v(0|[1-9][0-9]{0,8})\.json$`)
)

type file struct {
	typ, version, source string
	data                 []byte
}

// Load reads the embedded registry and opts.Dir and compiles every schema
// once. On any problem it returns a *LoadError naming each broken file.
func Load(opts LoadOptions) (*Registry, error) {
	return load(opts, true)
}

// load is Load, with elideRefs optional for tests that compare.
func load(opts LoadOptions, elide bool) (*Registry, error) {
	files := map[string]file{}
	var broken []FileError
	if !opts.NoEmbedded {
		broken = append(broken, collect(embedded, "embedded:", files)...)
	}
	if opts.Dir != "" {
		if st, err := os.Stat(opts.Dir); err != nil {
			return nil, fmt.Errorf("schema dir: %w", err)
		} else if !st.IsDir() {
			return nil, fmt.Errorf("schema dir %s is not a directory", opts.Dir)
		}
		broken = append(broken, collect(os.DirFS(opts.Dir), opts.Dir+string(filepath.Separator), files)...)
	}
	if len(files) == 0 && len(broken) == 0 {
		return nil, errors.New("schema registry is empty")
	}
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	sort.Strings(keys)

	r, compileErrs := compileAll(files, keys, elide)
	broken = append(broken, compileErrs...)
	if len(broken) > 0 {
		sort.Slice(broken, func(i, j int) bool { return broken[i].Source < broken[j].Source })
		return nil, &LoadError{Files: broken}
	}
	return r, nil
}

// collect reads every <type>/v<N>.json in fsys into files (later calls
// overwrite earlier ones). JSON files elsewhere or misnamed are broken;
// other files and dot-files are ignored.
func collect(fsys fs.FS, prefix string, files map[string]file) []FileError {
	var broken []FileError
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			broken = append(broken, FileError{Source: prefix + p, Err: err})
			return nil
		}
		if p != "." && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() || !strings.HasSuffix(p, ".json") {
			return nil
		}
		src := prefix + p
		typ, name := path.Split(p)
		typ = strings.TrimSuffix(typ, "/")
		m := versionRE.FindStringSubmatch(name)
		switch {
		case typ == "" || strings.Contains(typ, "/"):
			broken = append(broken, FileError{src, errors.New("not at <type>/v<N>.json")})
			return nil
		case !typeRE.MatchString(typ):
			broken = append(broken, FileError{src, fmt.Errorf("type %q: use letters, digits, '.', '_' or '-'", typ)})
			return nil
		case m == nil:
			broken = append(broken, FileError{src, fmt.Errorf("file name %q: want v<N>.json", name)})
			return nil
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			broken = append(broken, FileError{src, err})
			return nil
		}
		files[typ+"\x00"+m[1]] = file{typ: typ, version: m[1], source: src, data: data}
		return nil
	})
	if err != nil {
		broken = append(broken, FileError{Source: prefix, Err: err})
	}
	return broken
}

// compileAll compiles every file with one compiler so $refs resolve between
// them. A failed compile can leave the shared compiler holding a half-built
// schema that a later file would silently reuse, so when anything failed each
// remaining file is compiled again on its own to report it truthfully.
func compileAll(files map[string]file, keys []string, elide bool) (*Registry, []FileError) {
	r := &Registry{schemas: map[string]*jsonschema.Schema{}, latest: map[string]string{}}
	c, broken := newCompiler(files, keys)
	failed := map[string]bool{}
	for _, fe := range broken {
		failed[fe.Source] = true
	}
	for _, k := range keys {
		f := files[k]
		if failed[f.source] {
			continue
		}
		s, err := c.Compile(URL(f.typ, f.version))
		if err != nil {
			broken = append(broken, FileError{f.source, compileError(err)})
			failed[f.source] = true
			continue
		}
		if err := costlyPattern(s); err != nil {
			broken = append(broken, FileError{f.source, err})
			failed[f.source] = true
			continue
		}
		r.schemas[k] = s
		kind := KindMessage
		if isDefinitions(f.data) {
			kind = KindDefinitions
		}
		r.refs = append(r.refs, Ref{Type: f.typ, Version: f.version, Source: f.source, Kind: kind})
	}
	if len(broken) > 0 {
		for _, k := range keys {
			f := files[k]
			if failed[f.source] {
				continue
			}
			c, _ := newCompiler(files, keys)
			if _, err := c.Compile(URL(f.typ, f.version)); err != nil {
				broken = append(broken, FileError{f.source, compileError(err)})
			}
		}
		return nil, broken
	}
	roots := make([]*jsonschema.Schema, 0, len(keys))
	for _, k := range keys {
		roots = append(roots, r.schemas[k])
	}
	if elide {
		elideRefs(roots)
	}
	r.fast, r.noFast = compileFast(roots, c.Formats)
	r.inv = buildInvalidPath(r.fast, c.Formats)
	r.bound = make(map[*jsonschema.Schema]int, len(roots))
	for _, root := range roots {
		r.bound[root] = patternBound(root)
	}
	sort.Slice(r.refs, func(i, j int) bool {
		a, b := r.refs[i], r.refs[j]
		if a.Type != b.Type {
			return a.Type < b.Type
		}
		return versionLess(a.Version, b.Version)
	})
	for _, ref := range r.refs {
		r.latest[ref.Type] = ref.Version // sorted ascending: last wins
	}
	return r, nil
}

// newCompiler registers every sound file as a resource under its canonical
// URL. Files that fail precheck are left out, and a $ref to one of them says
// so. Loading anything else (the network, the file system) is refused.
func newCompiler(files map[string]file, keys []string) (*jsonschema.Compiler, []FileError) {
	c := jsonschema.NewCompiler()
	c.Draft = jsonschema.Draft2020
	c.AssertFormat = true
	registerFormats(c)
	brokenURL := map[string]string{}
	c.LoadURL = func(u string) (io.ReadCloser, error) {
		if src, ok := brokenURL[u]; ok {
			return nil, fmt.Errorf("$ref to %s, which is broken", src)
		}
		return nil, fmt.Errorf("%s is not in the registry (only <type>/v<N>.json under %s can be referenced)", u, baseURL)
	}
	metas := map[string]*jsonschema.Schema{}
	var broken []FileError
	for _, k := range keys {
		f := files[k]
		u := URL(f.typ, f.version)
		if err := precheck(f, metas); err != nil {
			broken = append(broken, FileError{f.source, err})
			brokenURL[u] = f.source
			continue
		}
		if err := c.AddResource(u, bytes.NewReader(f.data)); err != nil {
			broken = append(broken, FileError{f.source, compileError(err)})
			brokenURL[u] = f.source
		}
	}
	return c, broken
}

// precheck parses one file and validates it against its meta-schema on its
// own, so each error is pinned on the file that has it. Its $id, if any,
// must be its canonical URL: relative $refs resolve against it, so any other
// $id would silently point elsewhere.
func precheck(f file, metas map[string]*jsonschema.Schema) error {
	dec := json.NewDecoder(bytes.NewReader(f.data))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return fmt.Errorf("invalid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("invalid JSON: data after the top-level value")
	}
	obj, _ := doc.(map[string]any)
	if id, ok := obj["$id"]; ok && id != URL(f.typ, f.version) {
		return fmt.Errorf("$id %v must be %q (or absent)", id, URL(f.typ, f.version))
	}
	metaURL, _ := obj["$schema"].(string)
	if metaURL == "" {
		metaURL = "https://json-schema.org/draft/2020-12/schema"
	}
	meta, ok := metas[metaURL]
	if !ok {
		// Only the drafts built into the compiler resolve; any other
		// $schema is reported by the full compile.
		c := jsonschema.NewCompiler()
		c.LoadURL = func(u string) (io.ReadCloser, error) { return nil, fmt.Errorf("unknown $schema %s", u) }
		meta, _ = c.Compile(metaURL)
		metas[metaURL] = meta
	}
	if meta == nil {
		return nil
	}
	if err := meta.Validate(doc); err != nil {
		return compileError(err)
	}
	return nil
}

// compileError makes jsonschema's compile errors readable: a schema that
// breaks the meta-schema lists each broken keyword.
func compileError(err error) error {
	for {
		se, ok := err.(*jsonschema.SchemaError)
		if !ok || se.Err == nil {
			break
		}
		err = se.Err
	}
	var ve *jsonschema.ValidationError
	if errors.As(err, &ve) {
		vs, _ := flatten(ve, "", 10)
		parts := make([]string, len(vs))
		for i, v := range vs {
			parts[i] = v.String()
		}
		return fmt.Errorf("not a valid JSON Schema: %s", strings.Join(parts, "; "))
	}
	return err
}

func versionLess(a, b string) bool {
	x, _ := strconv.Atoi(a)
	y, _ := strconv.Atoi(b)
	return x < y
}

// Lookup returns the compiled schema of a type's version ("v2" and "2" both
// work). Subschemas that say nothing but "$ref" are compiled away (each
// applicator points at the $ref's target), so the KeywordLocation of its
// errors skips their "/$ref" step.
func (r *Registry) Lookup(typ, version string) (*jsonschema.Schema, bool) {
	s, ok := r.schemas[typ+"\x00"+NormalizeVersion(version)]
	return s, ok
}

// HasType reports whether the registry has any version of typ.
func (r *Registry) HasType(typ string) bool {
	_, ok := r.latest[typ]
	return ok
}

// Latest returns the highest version of typ.
func (r *Registry) Latest(typ string) (string, bool) {
	v, ok := r.latest[typ]
	return v, ok
}

// Refs lists every schema, message types and definitions, sorted by type
// then numeric version.
func (r *Registry) Refs() []Ref {
	return append([]Ref(nil), r.refs...)
}
