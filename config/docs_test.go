package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
)

// Every key config.Config reads from YAML is documented in docs/config.md
// exactly once, and the page documents no key that does not exist. A key is
// documented by a heading (`### queues[].retry`) or by a table row under a
// heading (`| \`tiers\` |` under `### queues[].retry` is queues[].retry.tiers).
// A key documented twice drifts: the two texts come to say different things.
func TestEveryConfigKeyDocumentedOnce(t *testing.T) {
	t.Parallel()
	_, file, _, _ := runtime.Caller(0)
	page, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "docs", "config.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := documentedKeys(string(page))
	keys := map[string]bool{}
	yamlKeys(reflect.TypeOf(config.Config{}), "", keys)
	if len(keys) == 0 {
		t.Fatal("no yaml keys found in config.Config")
	}
	var names []string
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		n := documented[k]
		switch {
		case n > 1:
			t.Errorf("docs/config.md documents %s %d times; document it once", k, n)
		case n == 0 && !keys[k]:
			t.Errorf("docs/config.md does not document %s", k)
		}
	}
	for k := range documented {
		if _, ok := keys[k]; !ok {
			t.Errorf("docs/config.md documents %s, which config.Config does not have", k)
		}
	}
}

// yamlKeys adds to keys every path under typ, as docs/config.md spells them
// (queues[].retry.tiers). The value says whether the key groups others (a
// mapping): those need no heading of their own, since their keys can be
// table rows of the parent (exchange.name), but may have one.
func yamlKeys(typ reflect.Type, prefix string, keys map[string]bool) {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		path := prefix + name
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			keys[path+"[]"] = true
			yamlKeys(ft.Elem(), path+"[].", keys)
			continue
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeOf(time.Time{}) {
			keys[path] = true
			yamlKeys(ft, path+".", keys)
			continue
		}
		keys[path] = false
	}
}

// documentedKeys counts the keys docs/config.md documents: each `##`/`###`
// heading's first word (a section, such as `queues[]`, `queues[].owner`),
// and each table row's key in backquotes, prefixed with its section. Every
// heading on the page names a key, so any other heading is reported as a key
// config.Config does not have.
func documentedKeys(page string) map[string]int {
	counts := map[string]int{}
	section := ""
	inFence := false
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		if h, ok := strings.CutPrefix(line, "## "); ok {
			section = strings.Fields(h)[0]
			counts[section]++
			continue
		}
		if h, ok := strings.CutPrefix(line, "### "); ok {
			section = strings.Fields(h)[0]
			counts[section]++
			continue
		}
		if section == "" || !strings.HasPrefix(line, "| `") {
			continue
		}
		key, _, ok := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
		if ok {
			counts[section+"."+key]++
		}
	}
	return counts
}
