package frame

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncateKeepsRunesWhole(t *testing.T) {
	t.Parallel()
	for n := 0; n < 40; n++ {
		got := Truncate(strings.Repeat("日本", 10), n)
		if !utf8.ValidString(got) || (len(got) > n && n >= len("…[truncated]")) {
			t.Fatalf("Truncate(_, %d) = %q (%d bytes)", n, got, len(got))
		}
	}
	if got := Truncate("short", 100); got != "short" {
		t.Fatalf("got %q", got)
	}
}
