package schemas_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/schemas"
)

func TestLoadEmbedded(t *testing.T) {
	t.Parallel()
	r := registry(t)
	var got []string
	for _, ref := range r.Refs() {
		got = append(got, ref.Type+"/v"+ref.Version)
		if !strings.HasPrefix(ref.Source, "embedded:") {
			t.Errorf("%s: source %q, want embedded:...", ref.Type, ref.Source)
		}
	}
	want := "common/v1 notifications.email/v1 notifications.sms/v1 orders.cancelled/v1 orders.created/v1 orders.created/v2"
	if strings.Join(got, " ") != want {
		t.Fatalf("refs = %v, want %s", got, want)
	}
	if v, ok := r.Latest("orders.created"); !ok || v != "2" {
		t.Errorf("Latest(orders.created) = %q, %v; want 2", v, ok)
	}
	if _, ok := r.Lookup("orders.created", "v2"); !ok {
		t.Error(`Lookup("orders.created", "v2") found nothing`)
	}
	if _, ok := r.Lookup("orders.created", "3"); ok {
		t.Error("Lookup of a version that does not exist succeeded")
	}
}

// writeFile writes content to dir/name, creating directories.
func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDirOverlay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A new version that reuses the embedded shared definitions, and an
	// override of an embedded file.
	writeFile(t, dir, "orders.created/v3.json", `{"type":"object","required":["total"],"properties":{"total":{"$ref":"../common/v1.json#/$defs/money"}}}`)
	writeFile(t, dir, "orders.cancelled/v1.json", `{"type":"object"}`)
	writeFile(t, dir, "README.md", "not a schema")
	r, err := schemas.Load(schemas.LoadOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := r.Latest("orders.created"); v != "3" {
		t.Errorf("latest orders.created = %s, want 3", v)
	}
	for _, ref := range r.Refs() {
		if ref.Type == "orders.cancelled" && !strings.HasPrefix(ref.Source, dir) {
			t.Errorf("orders.cancelled source %q, want the dir's file to win", ref.Source)
		}
	}
	s, _ := r.Lookup("orders.created", "3")
	if err := s.Validate(map[string]any{"total": map[string]any{"amount": "1", "currency": "eur"}}); err == nil {
		t.Error("$ref into the embedded common/v1.json did not apply")
	}
}

func TestLoadReportsEachBrokenFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "good/v1.json", `{"type":"object"}`)
	writeFile(t, dir, "syntax/v1.json", `{"type":`)
	writeFile(t, dir, "badkeyword/v1.json", `{"type":"objekt"}`)
	writeFile(t, dir, "danglingref/v1.json", `{"$ref":"../nowhere/v1.json"}`)
	writeFile(t, dir, "remote/v1.json", `{"$ref":"https://example.com/schema.json"}`)
	writeFile(t, dir, "wrongid/v1.json", `{"$id":"https://example.com/x.json"}`)
	writeFile(t, dir, "misnamed/version1.json", `{}`)
	writeFile(t, dir, "toplevel.json", `{}`)
	writeFile(t, dir, "usesbroken/v1.json", `{"$ref":"../badkeyword/v1.json"}`)

	_, err := schemas.Load(schemas.LoadOptions{Dir: dir, NoEmbedded: true})
	var le *schemas.LoadError
	if !errors.As(err, &le) {
		t.Fatalf("want *LoadError, got %v", err)
	}
	got := map[string]string{}
	for _, f := range le.Files {
		rel, _ := filepath.Rel(dir, strings.TrimSuffix(f.Source, string(filepath.Separator)))
		got[filepath.ToSlash(rel)] = f.Err.Error()
	}
	for _, want := range []string{"syntax/v1.json", "badkeyword/v1.json", "danglingref/v1.json", "remote/v1.json", "wrongid/v1.json", "misnamed/version1.json", "toplevel.json", "usesbroken/v1.json"} {
		if _, ok := got[want]; !ok {
			t.Errorf("%s not reported; got %v", want, got)
		}
	}
	if _, ok := got["good/v1.json"]; ok {
		t.Errorf("good/v1.json reported broken: %s", got["good/v1.json"])
	}
	if len(got) != 8 {
		t.Errorf("got %d broken files, want 8: %v", len(got), got)
	}
	t.Log(err)
}

func TestLoadMissingDir(t *testing.T) {
	t.Parallel()
	if _, err := schemas.Load(schemas.LoadOptions{Dir: filepath.Join(t.TempDir(), "nope")}); err == nil {
		t.Fatal("want an error for a missing dir")
	}
}

// common/v1.json only holds $defs for other schemas: it is listed as
// definitions, not as a message type. A file with $defs and a root that
// asserts something is a message type.
func TestDefinitionsAreNotMessageTypes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "shared/v1.json", `{"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "x", "$defs": {"id": {"type": "string"}}}`)
	writeFile(t, dir, "typed/v1.json", `{"$defs": {"id": {"type": "string"}}, "type": "object", "properties": {"id": {"$ref": "#/$defs/id"}}}`)
	writeFile(t, dir, "anything/v1.json", `{}`)
	r, err := schemas.Load(schemas.LoadOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, ref := range r.Refs() {
		kinds[ref.Type] = ref.Kind
	}
	for typ, want := range map[string]string{
		"common": schemas.KindDefinitions, "shared": schemas.KindDefinitions,
		"typed": schemas.KindMessage, "anything": schemas.KindMessage, "orders.created": schemas.KindMessage,
	} {
		if kinds[typ] != want {
			t.Errorf("%s: kind %q, want %q", typ, kinds[typ], want)
		}
	}
}
