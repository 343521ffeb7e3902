package schemas

import (
	"os"
	"path/filepath"
	"testing"
)

// example is a realistic, valid message of one registry schema, from
// testdata/examples/<type>/v<N>.json: the seeds of the differential fuzz
// test and the messages the gate is benchmarked on.
type example struct {
	Type, Version string
	Body          []byte
}

// examples returns one example per message schema in the embedded registry,
// sorted like Registry.Refs, and fails if a message schema has none.
func examples(t testing.TB) []example {
	t.Helper()
	r, err := Load(LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []example
	for _, ref := range r.Refs() {
		if ref.Kind != KindMessage {
			continue
		}
		body, err := os.ReadFile(filepath.Join("testdata", "examples", ref.Type, "v"+ref.Version+".json"))
		if err != nil {
			t.Fatalf("every message schema needs an example: %v", err)
		}
		out = append(out, example{ref.Type, ref.Version, body})
	}
	return out
}

// Examples is examples, for the external tests.
var Examples = examples
