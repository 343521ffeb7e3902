package schemas_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/schemas"
)

// A pattern whose program is large (fifty alternatives of [a-z]{0,1000}:
// tens of seconds of CPU for a 2 KB string) is refused at load, which is
// what `schemas lint` runs, wherever it sits in the schema; the patterns
// schemas use for codes and identifiers load.
func TestLoadRefusesCostlyPatterns(t *testing.T) {
	t.Parallel()
	alts := strings.TrimSuffix(strings.Repeat("[a-z]{0,1000}|", 50), "|")
	for name, schema := range map[string]string{
		"pattern":           `{"type": "string", "pattern": "^(` + alts + `)$"}`,
		"nested pattern":    `{"type": "object", "properties": {"a": {"items": {"pattern": "(` + alts + `)"}}}}`,
		"patternProperties": `{"type": "object", "patternProperties": {"^(` + alts + `)$": {}}}`,
	} {
		dir := t.TempDir()
		writeFile(t, dir, "costly/v1.json", schema)
		_, err := schemas.Load(schemas.LoadOptions{Dir: dir, NoEmbedded: true})
		var le *schemas.LoadError
		if !errors.As(err, &le) || len(le.Files) != 1 || !strings.Contains(le.Files[0].Err.Error(), "regexp instructions") {
			t.Errorf("%s: got %v, want the file refused for its pattern's size", name, err)
		}
	}
	dir := t.TempDir()
	writeFile(t, dir, "fine/v1.json", `{"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]{0,254}$"},
		"mail": {"type": "string", "pattern": "^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]{1,253}$"}}}`)
	if _, err := schemas.Load(schemas.LoadOptions{Dir: dir, NoEmbedded: true}); err != nil {
		t.Errorf("ordinary patterns: %v", err)
	}
}
