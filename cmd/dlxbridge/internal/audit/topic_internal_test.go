package audit

import (
	"strings"
	"testing"
)

// topicNaive is the plain recursive reading of the topic rules, exponential
// on hostile input: the reference for small ones.
func topicNaive(p, k []string) bool {
	if len(p) == 0 {
		return len(k) == 0
	}
	switch p[0] {
	case "#":
		for i := 0; i <= len(k); i++ {
			if topicNaive(p[1:], k[i:]) {
				return true
			}
		}
		return false
	case "*":
		return len(k) > 0 && topicNaive(p[1:], k[1:])
	}
	return len(k) > 0 && k[0] == p[0] && topicNaive(p[1:], k[1:])
}

// Every pattern and key of up to four words over a small alphabet (empty
// words included) match as the recursive reading says.
func TestTopicMatchAgreesWithTheRules(t *testing.T) {
	words := []string{"a", "b", "*", "#", ""}
	var all []string
	var gen func(prefix []string)
	gen = func(prefix []string) {
		all = append(all, strings.Join(prefix, "."))
		if len(prefix) == 4 {
			return
		}
		for _, w := range words {
			gen(append(prefix, w))
		}
	}
	gen(nil)
	for _, p := range all {
		for _, k := range all {
			if strings.ContainsAny(k, "*#") {
				continue
			}
			if got, want := topicMatch(p, k), topicNaive(strings.Split(p, "."), strings.Split(k, ".")); got != want {
				t.Fatalf("topicMatch(%q, %q) = %v, want %v", p, k, got, want)
			}
		}
	}
}
