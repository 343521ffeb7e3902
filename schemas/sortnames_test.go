package schemas

import "testing"

func TestSortNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{`additionalProperties 'b', 'a' not allowed`, `additionalProperties 'a', 'b' not allowed`},
		{`additionalProperties 'it\'s', 'a, b', 'a' not allowed`, `additionalProperties 'a', 'a, b', 'it\'s' not allowed`},
		{`additionalProperties 'x\', 'y', 'a' not allowed`, `additionalProperties 'x\', 'y', 'a' not allowed`}, // 'x\', ' is one name, then junk
		{`additionalProperties 'only' not allowed`, `additionalProperties 'only' not allowed`},
		// Not jsonschema's shape: left as it is.
		{`additionalProperties 'b', 'a`, `additionalProperties 'b', 'a`},
		{`additionalProperties 'b' 'a' not allowed`, `additionalProperties 'b' 'a' not allowed`},
		{`additionalProperties b, a not allowed`, `additionalProperties b, a not allowed`},
		{`additionalProperties 'b', 'a\' not allowed`, `additionalProperties 'b', 'a\' not allowed`},
		{`something else`, `something else`},
	} {
		if got := sortNames(c.in); got != c.want {
			t.Errorf("sortNames(%q) = %q, want %q", c.in, got, c.want)
		}
		if got := sortNames(sortNames(c.in)); got != sortNames(c.in) {
			t.Errorf("sortNames is not idempotent on %q", c.in)
		}
	}
}
