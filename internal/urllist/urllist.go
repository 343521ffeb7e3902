// Package urllist splits a list of URLs written as one string, the form
// that RABBITMQ_URL, --url and broker.management_url take for the nodes of
// a cluster: "amqp://a:5672/,amqp://b:5672/".
package urllist

import "strings"

// Split splits raw at each comma that ends a URL: one followed (after
// spaces) by one of schemes and "://", by another comma, or by the end of
// raw. Any other comma belongs to the URL it is in: a password such as
// "pa,ss" that was not percent-encoded still reads as before, and so does
// a single URL. Spaces around each entry are trimmed; an entry may be
// empty (",," or a trailing comma), for the caller to refuse with its
// position. A raw without such a comma is one entry.
func Split(raw string, schemes ...string) []string {
	var out []string
	start := 0
	for i := 0; i < len(raw); i++ {
		if raw[i] != ',' || !endsEntry(raw[i+1:], schemes) {
			continue
		}
		out = append(out, strings.TrimSpace(raw[start:i]))
		start = i + 1
	}
	return append(out, strings.TrimSpace(raw[start:]))
}

func endsEntry(rest string, schemes []string) bool {
	rest = strings.TrimLeft(rest, " \t")
	if rest == "" || rest[0] == ',' {
		return true
	}
	for _, s := range schemes {
		p := s + "://"
		if len(rest) >= len(p) && strings.EqualFold(rest[:len(p)], p) {
			return true
		}
	}
	return false
}
