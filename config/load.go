package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// FieldError is one problem with one field.
type FieldError struct {
	// Path is the field's path, e.g. "queues[1].retry.tiers[0]".
	Path string
	// Msg says what is wrong.
	Msg string
}

func (e FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Errors is every problem found in a config; Load returns it (as error) when
// the file is invalid.
type Errors []FieldError

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// AsErrors unwraps the list of field errors from err, if it holds one.
func AsErrors(err error) (Errors, bool) {
	var es Errors
	ok := errors.As(err, &es)
	return es, ok
}

// Load reads, checks and defaults the config file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data)
}

// Parse checks and defaults a config document. Unknown keys are errors. On
// any problem it returns Errors listing all of them.
func Parse(data []byte) (*Config, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, Errors{{Msg: "config is empty"}}
		}
		return nil, Errors{{Msg: "not valid YAML: " + yamlError(data, err)}}
	}
	// A second document would be read by nobody: a config split by a stray
	// "---" loses its second half silently otherwise.
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, Errors{{Msg: "not valid YAML: " + yamlError(data, err)}}
		}
		return nil, Errors{{Msg: fmt.Sprintf("yaml: line %d: a second YAML document (after \"---\"); a config is one document", extra.Line)}}
	}
	var errs Errors
	copyScalarAliases(&root)
	checkKeys(&root, reflect.TypeOf(Config{}), "", &errs, map[aliased]bool{})
	// Decode even after key problems: a type error elsewhere in the file
	// belongs in the same report, one line each, rather than in the next
	// run's.
	var cfg Config
	if err := root.Decode(&cfg); err != nil {
		// A field that did not decode would read as unset: validating
		// the rest would report problems the file does not have.
		return nil, append(errs, decodeErrors(&root, err, errs)...)
	}
	// After unknown keys too, the values that did decode are validated,
	// so that one run lists every problem.
	if err := cfg.Complete(); err != nil {
		var more Errors
		if !errors.As(err, &more) {
			return nil, err
		}
		errs = append(errs, more...)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return &cfg, nil
}

// Complete fills every unset field of c with its default and validates the
// result: what Load and Parse do once the file is read. A Config built in
// code goes through it before it is handed to consumer or topology. On any
// problem it returns Errors listing all of them. Calling it again changes
// nothing.
func (c *Config) Complete() error {
	c.ApplyDefaults()
	return c.Validate()
}

// yamlLine is how yaml.v3 places a problem.
var yamlLine = regexp.MustCompile(`\bline \d+\b`)

// yamlError is err's message with the line of the problem. yaml.v3 leaves
// the line out when the problem is on the first line, and for bytes YAML
// does not allow (invalid UTF-8, control characters), which it only places
// by offset, inaccessibly.
func yamlError(data []byte, err error) string {
	msg := err.Error()
	if yamlLine.MatchString(msg) {
		return msg
	}
	line := 1
	if strings.Contains(msg, "UTF-8") || strings.Contains(msg, "Unicode") || strings.Contains(msg, "control characters") {
		line += bytes.Count(data[:firstNonYAML(data)], []byte("\n"))
	}
	return fmt.Sprintf("yaml: line %d: %s", line, strings.TrimPrefix(msg, "yaml: "))
}

// firstNonYAML is the offset of the first byte that is not part of a
// character YAML allows (tab, line breaks, printable Unicode), or len(data).
func firstNonYAML(data []byte) int {
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && n <= 1,
			r < 0x20 && r != '\t' && r != '\n' && r != '\r',
			r >= 0x7f && r <= 0x9f && r != 0x85,
			r >= 0xd800 && r <= 0xdfff, r == 0xfffe, r == 0xffff:
			return i
		}
		i += n
	}
	return len(data)
}

// decodeErrors turns a decode error into one FieldError per problem, each
// placed at the path of the field on its line where there is one. A
// duration that does not parse was reported by checkKeys already, by path;
// yaml.v3 repeats it as a type error, left out here, as is any type error
// at a path checkKeys reported (a list where a mapping belongs). After
// key problems, yaml.v3's other errors are about the same mistakes.
func decodeErrors(root *yaml.Node, err error, reported Errors) Errors {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		if len(reported) > 0 {
			return nil
		}
		return Errors{{Msg: decodeMessage(root, err)}}
	}
	known := map[string]bool{}
	for _, e := range reported {
		known[e.Path] = true
	}
	paths := map[int]string{}
	linePaths(root, "", paths, map[*yaml.Node]bool{})
	var es Errors
	for _, e := range te.Errors {
		if typeErrorRE.MatchString(e) && strings.HasSuffix(e, "into time.Duration") {
			continue
		}
		fe := FieldError{Msg: "wrong type: " + e}
		if m := typeErrorLineRE.FindStringSubmatch(e); m != nil {
			line, _ := strconv.Atoi(m[1])
			fe.Path = paths[line]
		}
		if fe.Path != "" && known[fe.Path] {
			continue
		}
		es = append(es, fe)
	}
	return es
}

var (
	// typeErrorRE matches yaml.v3's message for a scalar of the wrong type.
	typeErrorRE     = regexp.MustCompile("cannot unmarshal !!(str|int|float|bool) `")
	typeErrorLineRE = regexp.MustCompile(`^line (\d+):`)
)

// linePaths maps each line holding a scalar value to the value's path, the
// first one on the line (yaml.v3 places a type error by line only).
// Aliases are not followed: a value has its path where it is written.
func linePaths(n *yaml.Node, path string, out map[int]string, seen map[*yaml.Node]bool) {
	if n == nil || seen[n] {
		return
	}
	seen[n] = true
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			linePaths(c, path, out, seen)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			linePaths(n.Content[i+1], join(path, n.Content[i].Value), out, seen)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			linePaths(c, fmt.Sprintf("%s[%d]", path, i), out, seen)
		}
	case yaml.ScalarNode:
		if _, ok := out[n.Line]; !ok && path != "" {
			out[n.Line] = path
		}
	}
}

func decodeMessage(root *yaml.Node, err error) string {
	msg := err.Error()
	if line := firstAlias(root); line > 0 && !yamlLine.MatchString(msg) && strings.Contains(msg, "alias") {
		// "document contains excessive aliasing": place it at the first
		// alias.
		msg = fmt.Sprintf("yaml: line %d: %s", line, strings.TrimPrefix(msg, "yaml: "))
	}
	return msg
}

// firstAlias is the line of the first alias in n, or 0.
func firstAlias(n *yaml.Node) int {
	if n.Kind == yaml.AliasNode {
		return n.Line
	}
	for _, c := range n.Content {
		if line := firstAlias(c); line > 0 {
			return line
		}
	}
	return 0
}

var durationType = reflect.TypeOf(time.Duration(0))

// zeroRefused are the keys whose unset value is 0 in Go (so a Config built
// in code gets the default) but where a 0 written in the file means
// something else to a reader: "no retries", AMQP's "no prefetch limit", or
// "no delivery limit".
// Written, it is refused rather than silently replaced by the default.
var zeroRefused = map[string]string{
	".retry.max_attempts":             "0 is not allowed: 1 means no retries (the first delivery only); leave the key out for the default, 5",
	".consumer.prefetch":              "0 is not allowed (to AMQP it means no limit): use 1 to 2000, or leave the key out for the default, 20",
	".consumer.concurrency":           "0 is not allowed: use 1 or more, or leave the key out for the default, 4",
	"broker.replicas":                 "0 is not allowed: use 1 or more (usually 3), or leave the key out for the broker's default",
	".delivery_limit":                 "0 is not allowed: the broker's delivery limit cannot be turned off; use 1 or more, or leave the key out for the default, 5",
	".consumer.crash_loop_deliveries": "0 is not allowed: the crash-loop guard cannot be turned off; use 1 to delivery_limit, or leave the key out for the default, delivery_limit - 1",
}

// copyScalarAliases gives every alias of a scalar its own copy of it, before
// checkKeys retags a bare 0 in a duration's place as a string: the anchored
// node shared by an alias in a number's place (jitter: &z 0, max_elapsed: *z)
// would otherwise become a string there too, and the number refused. It
// walks the tree once, without following aliases; a scalar has no children,
// so the copies cost what the aliases do.
func copyScalarAliases(n *yaml.Node) {
	if n.Kind == yaml.AliasNode {
		if a := n.Alias; a != nil && a.Kind == yaml.ScalarNode {
			c := *a
			c.Anchor = ""
			c.Line, c.Column = n.Line, n.Column
			*n = c
		}
		return
	}
	for _, c := range n.Content {
		copyScalarAliases(c)
	}
}

// checkKeys walks the YAML tree beside the Go type and reports every mapping
// key that has no field, with its path. yaml.v3's KnownFields reports only the
// first one and by line, not by path. An anchored node is walked once per Go
// type (seen), however often it is aliased: a few kilobytes of nested
// aliases would otherwise be walked billions of times.
func checkKeys(n *yaml.Node, t reflect.Type, path string, errs *Errors, seen map[aliased]bool) {
	if n == nil {
		return
	}
	if n.Kind == yaml.DocumentNode {
		for _, c := range n.Content {
			checkKeys(c, t, path, errs, seen)
		}
		return
	}
	if n.Kind == yaml.AliasNode {
		if k := (aliased{n.Alias, t}); !seen[k] {
			seen[k] = true
			checkKeys(n.Alias, t, path, errs, seen)
		}
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" && strings.Trim(n.Value, "+-0") == "" {
		for suffix, msg := range zeroRefused {
			if strings.HasSuffix(path, suffix) {
				*errs = append(*errs, FieldError{path, msg})
			}
		}
	}
	switch {
	case t == durationType:
		if n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
			if _, err := time.ParseDuration(n.Value); err != nil {
				*errs = append(*errs, FieldError{path, fmt.Sprintf("%q is not a duration (use e.g. 500ms, 5s, 2m)", n.Value)})
			} else if n.Tag == "!!int" {
				// A bare 0 (the docs' "0 = none"): a duration to Go,
				// an integer to YAML, which yaml.v3 will not put in a
				// time.Duration.
				n.Tag = "!!str"
			}
		}
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			if n.Tag != "!!null" {
				msg := "must be a mapping"
				if path == "" { // the document itself: no path to name it
					msg = fmt.Sprintf("line %d: the config must be a mapping", n.Line)
				}
				*errs = append(*errs, FieldError{path, msg})
			}
			return
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			ft, ok := fields[key]
			p := join(path, key)
			if !ok {
				msg := "unknown key" + suggest(key, fields)
				if key == "" { // nothing to show in the path
					msg = fmt.Sprintf("line %d: empty or non-string key", n.Content[i].Line)
				}
				*errs = append(*errs, FieldError{p, msg})
				continue
			}
			checkKeys(n.Content[i+1], ft, p, errs, seen)
		}
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			if n.Tag != "!!null" {
				*errs = append(*errs, FieldError{path, "must be a list"})
			}
			return
		}
		for i, c := range n.Content {
			checkKeys(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), errs, seen)
		}
	}
}

// aliased is an anchored node walked as a Go type.
type aliased struct {
	n *yaml.Node
	t reflect.Type
}

func yamlFields(t reflect.Type) map[string]reflect.Type {
	m := make(map[string]reflect.Type, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		m[name] = f.Type
	}
	return m
}

func suggest(key string, fields map[string]reflect.Type) string {
	best, bestD := "", 3
	for name := range fields {
		if d := levenshtein(key, name); d < bestD || (d == bestD && name < best) {
			best, bestD = name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
