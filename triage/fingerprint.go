package triage

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
	"sync"
	"unicode/utf8"
)

// Normalization limits: input beyond its first 1024 bytes is not read,
// output is capped at maxNormalizedLen bytes.
const (
	maxNormalizeInput = 1024
	maxNormalizedLen  = 256
	maxPasses         = 8
)

// Replacements, applied in order. Placeholders contain no digits, quotes or
// hex runs, so a second pass leaves them alone.
var normalizers = []struct {
	re   *regexp.Regexp
	with string // "" means: use hexOrNumber
}{
	{regexp.MustCompile(`"(?:[^"\\]|\\.)*"|` + "`[^`]*`"), "<str>"},
	// A single quote opens a string only after a non-word character, so
	// apostrophes ("can't") are left alone.
	{regexp.MustCompile(`(^|[^\pL\pN_])'[^']*'`), "${1}<str>"},
	{regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`), "<uuid>"},
	{regexp.MustCompile(`\[[0-9a-f:.]*:[0-9a-f:.]*\](?::\d+)?`), "<ip>"},
	{regexp.MustCompile(`\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b`), "<ip>"},
	{regexp.MustCompile(`\b(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+\b`), "<dur>"},
	{regexp.MustCompile(`\b0x[0-9a-f]+\b|\b[0-9a-f]{8,}\b`), ""},
	{regexp.MustCompile(`\d+(?:\.\d+)?`), "<n>"},
	{regexp.MustCompile(`\s+`), " "},
}

// NormalizeMessage reduces an error message to its shape, so the same
// failure with different ids groups together: lowercase; quoted strings →
// <str>; UUIDs → <uuid>; IPv4/[IPv6] addresses with optional port → <ip>;
// durations (1.5s, 2m30s) → <dur>; hex ids of 8+ digits → <hex>; other
// numbers → <n>; whitespace collapsed and trimmed. Only the first 1 KiB
// is read and the result is valid UTF-8 of at most maxNormalizedLen bytes.
func NormalizeMessage(s string) string {
	if len(s) > maxNormalizeInput {
		s = s[:maxNormalizeInput]
	}
	if n, ok := normalized.get(s); ok {
		return n
	}
	n := normalize(s)
	normalized.put(s, n)
	return n
}

// normalized remembers recent NormalizeMessage results. A storm repeats a
// few error texts thousands of times (every retry and quarantine is
// fingerprinted), and the regular expressions cost tens of µs for a short
// text and hundreds for 1 KiB (BenchmarkNormalizeMessage, uncached).
// It holds at most normalizedCap inputs of at most maxNormalizeInput bytes
// each, and starts over when full.
var normalized = normalizeCache{m: map[string]string{}}

const normalizedCap = 256

type normalizeCache struct {
	mu sync.Mutex
	m  map[string]string
}

func (c *normalizeCache) get(s string) (string, bool) {
	c.mu.Lock()
	n, ok := c.m[s]
	c.mu.Unlock()
	return n, ok
}

func (c *normalizeCache) put(s, n string) {
	c.mu.Lock()
	if len(c.m) >= normalizedCap {
		clear(c.m)
	}
	c.m[strings.Clone(s)] = n // not a slice of a larger string kept alive
	c.mu.Unlock()
}

func normalize(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ToLower(s)
	// Replacing one token can expose another (a quote or hex run next to
	// a former number now sits at a word boundary), so repeat until
	// nothing changes: the result is stable under NormalizeMessage.
	for range maxPasses {
		prev := s
		for _, n := range normalizers {
			if n.with == "" {
				s = n.re.ReplaceAllStringFunc(s, hexOrNumber)
				continue
			}
			s = n.re.ReplaceAllString(s, n.with)
		}
		if s == prev {
			break
		}
	}
	s = strings.TrimSpace(s)
	if len(s) > maxNormalizedLen {
		cut := maxNormalizedLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = strings.TrimSpace(s[:cut])
	}
	return s
}

// hexOrNumber keeps long decimal ids with the other numbers, so an id
// that grows past 8 digits does not change the fingerprint.
func hexOrNumber(m string) string {
	if strings.Trim(m, "0123456789") == "" {
		return "<n>"
	}
	return "<hex>"
}

// Fingerprint groups failures: the first 16 hex digits of
// sha256(class ‖ NormalizeMessage(errMsg) ‖ msgType ‖ version), fields
// separated by NUL bytes.
func Fingerprint(class Class, errMsg, msgType, version string) string {
	h := sha256.New()
	for _, part := range []string{string(class), NormalizeMessage(errMsg), msgType, version} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
