package brokertest

import (
	"strings"
	"testing"
)

// Secret is a password that Go's URL parser chokes on or misreads when it is
// written into a URL without percent-encoding, and the pieces of it that an
// error, a log line or a command's output must never show.
type Secret struct {
	Password string
	// Pieces are substrings that betray the password: the password itself
	// and what url.Parse quotes of it (`invalid port ":p"`, `invalid URL
	// escape "%zz"`) or misreads it as (a host, a port, a vhost).
	Pieces []string
}

// HostileSecrets returns the passwords the leak tests put into every URL a
// user can give: with '#', '/', '?' or '@' in them, a bad or lone '%'
// escape, and digits that url.Parse takes for a port once '#' cuts the
// userinfo short.
func HostileSecrets() []Secret {
	return []Secret{
		{"s3cr3t#x", []string{"s3cr3t"}},
		{"p/ss", []string{"p/ss", `":p"`, "ss@"}},
		{"a?b", []string{"a?b", `":a"`, "b@"}},
		{"p@ss", []string{"p@ss", "ss@"}},
		{"bad%zz", []string{"bad%zz", "%zz"}},
		{"%", []string{`"%"`, ":%@"}},
		{"86753#09", []string{"86753"}},
		{"4711/vh", []string{"4711"}},
	}
}

// passThrough is text that only Go's URL parser writes: seeing it means a
// parser error, which quotes the URL, reached the output unchanged.
var passThrough = []string{"invalid port", "invalid URL escape", `parse "`}

// WithPassword returns "scheme://user:password@rest" with password written
// as is (not percent-encoded), as a user might paste it.
func WithPassword(scheme, user, password, rest string) string {
	return scheme + "://" + user + ":" + password + "@" + rest
}

// Check reports (without failing fast) every piece of the secret, and every
// sign of a passed-through URL parser error, found in out. where names the
// output in the failure message.
func (s Secret) Check(t testing.TB, where, out string) {
	t.Helper()
	for _, p := range append(append([]string{}, s.Pieces...), passThrough...) {
		if strings.Contains(out, p) {
			t.Errorf("password %q: %s contains %q:\n%s", s.Password, where, p, out)
		}
	}
}
