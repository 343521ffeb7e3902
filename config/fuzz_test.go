package config_test

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/config"
)

// yamlPosition is how yaml.v3 places a problem in the document.
var yamlPosition = regexp.MustCompile(`\bline \d+\b`)

// FuzzConfigLoad: Parse never panics on any bytes; every error it returns
// names a field path or a YAML line (or says the document is empty); and a
// config it accepts is complete: Complete on it again succeeds and changes
// nothing.
func FuzzConfigLoad(f *testing.F) {
	for _, path := range []string{"../config.yaml", "../examples/library/config.yaml"} {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, doc := range []string{
		queueDoc(""),
		queueDoc("retry: {tiers: [1s, 1500ms], jitter: 0.5, lanes: 3, max_elapsed: 0s}\nconsumer: {prefetch: 0, concurrency: -1}"),
		queueDoc("message: {from: envelope}\nquarantine: {redact: {fields: [/customer/email], headers: [authorization]}}"),
		queueDoc("exchange: {name: x, type: fanout}\nbindings: []\ndelivery_limit: 1"),
		"queues: [{name: a, accepts: [{type: t, versions: [v1]}]}, {name: a}]",
		"broker: {management_url: 'ftp://x'}\nschemas: {max_body_bytes: -1}\nqueues: []",
		"x: &a [*a]", "queues: &q\n  - *q", "queues:\n  - name: [1, 2]", "queues: {name: a}",
		"retry:\n\ttiers: [1s]", "\xff\xfe", aliasBomb(60), "---\n...\n---\nqueues: 1", "", "# nothing",
	} {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse(data)
		if err != nil {
			if cfg != nil {
				t.Fatalf("Parse returned a config and an error: %v", err)
			}
			es, ok := config.AsErrors(err)
			if !ok || len(es) == 0 {
				t.Fatalf("Parse error is %T, not config.Errors: %v", err, err)
			}
			for _, e := range es {
				if e.Path == "" && !yamlPosition.MatchString(e.Msg) && e.Msg != "config is empty" {
					t.Errorf("error with neither a field path nor a YAML line: %q", e.Msg)
				}
			}
			return
		}
		// Parse the same bytes again for a config that shares nothing
		// with cfg, and complete that one a second time.
		again, err := config.Parse(data)
		if err != nil || !reflect.DeepEqual(cfg, again) {
			t.Fatalf("Parse is not deterministic: %v", err)
		}
		if err := again.Complete(); err != nil {
			t.Fatalf("Complete rejects what Parse accepted: %v", err)
		}
		if !reflect.DeepEqual(cfg, again) {
			t.Fatalf("a second Complete changed the config:\n%+v\n%+v", cfg, again)
		}
	})
}

// aliasBomb is a valid-looking config that aliases a queue n times, each
// with n aliases of one accept of n versions: n³ values from a few bytes.
func aliasBomb(n int) string {
	aliases := func(s string) string { return strings.TrimSuffix(strings.Repeat(s+", ", n), ", ") }
	return "queues:\n  - &q {name: a, exchange: {name: x}, accepts: [&a {type: t, versions: [" + aliases(`"1"`) + "]}, " + aliases("*a") + "]}\n  - " +
		strings.Repeat("*q\n  - ", n) + "*q\n"
}

// TestAliasesAreCheckedOnce: a node aliased many times, inside another
// aliased many times, is checked once per use of its anchor, not once per
// path through the aliases: a few kilobytes of nested aliases took seconds
// to reject, and would report each problem at every path.
func TestAliasesAreCheckedOnce(t *testing.T) {
	t.Parallel()
	aliases := func(name string, n int) string { return strings.TrimSuffix(strings.Repeat("*"+name+", ", n), ", ") }
	doc := "queues: [&q {name: a, exchange: {name: x}, accepts: [&a {type: t, versions: [\"1\"], bogus: 1}, " + aliases("a", 30) + "]}, " + aliases("q", 30) + "]\n"
	_, err := config.Parse([]byte(doc))
	es, ok := config.AsErrors(err)
	if !ok {
		t.Fatalf("want config.Errors, got %v", err)
	}
	// The values that decoded are validated too (the duplicates the
	// aliases make are real problems of the document); the unknown key
	// itself is reported once per use of its anchor.
	bogus := 0
	for _, e := range es {
		if strings.Contains(e.Error(), "bogus") {
			bogus++
		}
	}
	if bogus == 0 || bogus > 5 {
		t.Fatalf("%d errors for one unknown key behind aliases:\n%v", bogus, err)
	}
}
