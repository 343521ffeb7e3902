package urllist_test

import (
	"slices"
	"testing"

	"github.com/dlxbridge/dlxbridge/internal/urllist"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		raw  string
		want []string
	}{
		{"amqp://a/", []string{"amqp://a/"}},
		{"amqp://a/,amqp://b/", []string{"amqp://a/", "amqp://b/"}},
		{" amqp://a/ , AMQPS://b/ ,amqp://c:1/", []string{"amqp://a/", "AMQPS://b/", "amqp://c:1/"}},
		// A comma inside a URL is not a separator: an unencoded password
		// or a vhost reads as it always did.
		{"amqp://u:pa,ss@a/", []string{"amqp://u:pa,ss@a/"}},
		{"amqp://u:pa,ss@a/v,h,amqp://u:x,y@b/", []string{"amqp://u:pa,ss@a/v,h", "amqp://u:x,y@b/"}},
		// Hosts listed without a scheme each stay in one entry (and fail
		// to parse there, with the caller's hint).
		{"amqp://a:5672,b:5672/", []string{"amqp://a:5672,b:5672/"}},
		// Empty entries are kept for the caller to refuse.
		{"amqp://a/,", []string{"amqp://a/", ""}},
		{"amqp://a/,,amqp://b/", []string{"amqp://a/", "", "amqp://b/"}},
		{",amqp://a/", []string{"", "amqp://a/"}},
		{"", []string{""}},
		{"http://m1:15672,https://m2:15672/x", []string{"http://m1:15672", "https://m2:15672/x"}},
	} {
		got := urllist.Split(c.raw, "amqp", "amqps", "http", "https")
		if !slices.Equal(got, c.want) {
			t.Errorf("Split(%q) = %q, want %q", c.raw, got, c.want)
		}
	}
}
