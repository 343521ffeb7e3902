package audit_test

import (
	"strings"
	"testing"
)

// Another application's binding key and dead-letter routing key are its
// text, up to 255 bytes each: a topic pattern of many "#" words against a
// key of many words that it does not match must not make the audit try
// every way of splitting the key (exponential: this one never ends). The
// routing below still finds the one binding that matches.
func TestAuditOfAHostileTopicPatternEnds(t *testing.T) {
	t.Parallel()
	hashes := strings.Repeat("#.", 60) + "z"                 // 121 bytes, 60 "#"
	key := strings.TrimSuffix(strings.Repeat("a.", 60), ".") // 60 words, no "z"
	w := newWorld(v40).exchange("dlx", "topic").
		queue("dlq", "quorum", nil).
		queue("trap", "quorum", nil).
		bind("dlx", "trap", hashes).
		queue("src", "quorum", map[string]any{"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": key, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
	r := w.run()
	if !strings.Contains(strings.Join(rules(r), " "), "dlx-unroutable src") {
		t.Errorf("findings %q: want dlx-unroutable src (the pattern needs a last word z)", rules(r))
	}
	w.bind("dlx", "dlq", "#.a.#.a")
	if got := strings.Join(rules(w.run()), " "); strings.Contains(got, "dlx-unroutable src") {
		t.Errorf("findings %q: src's dead letters reach dlq", got)
	}
}
