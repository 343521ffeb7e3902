package apicheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// mdLink is an inline markdown link's target: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// Every relative link in the README and docs/ names a file or folder that
// exists, and a #fragment names a heading of the page it points at. Pages
// move and sections get renamed; a reader following a dead link learns
// nothing.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"))
	anchors := map[string]map[string]bool{}
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		anchors[page] = headingAnchors(string(text))
		return anchors[page]
	}
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, page)
		for _, m := range mdLink.FindAllStringSubmatch(withoutCode(string(text)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, fragment, _ := strings.Cut(target, "#")
			dest := page
			if file != "" {
				dest = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %s: no such file", rel, target)
					continue
				}
			}
			if fragment != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[fragment] {
				t.Errorf("%s: link %s: no heading with that anchor", rel, target)
			}
		}
	}
}

// withoutCode drops fenced code blocks, whose brackets are not links.
func withoutCode(md string) string {
	var b strings.Builder
	fenced := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// headingAnchors returns the anchors GitHub gives a page's headings:
// lower case, punctuation dropped, spaces as hyphens, and -1, -2… on
// repeats.
func headingAnchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range strings.Split(withoutCode(md), "\n") {
		h := strings.TrimLeft(line, "#")
		if len(h) == len(line) || !strings.HasPrefix(h, " ") || len(line)-len(h) > 6 {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(h)) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}
