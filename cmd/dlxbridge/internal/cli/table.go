package cli

import (
	"io"
	"strings"
	"unicode/utf8"
)

// tableWidth is what the text tables fit by default: an on-call terminal,
// a split pane, a pasted incident note. --wide lifts every cap.
const tableWidth = 100

// column is one column of a text table. max caps its width when the table
// is fitted (0: the column takes what the others leave, at least min).
type column struct {
	name     string
	max, min int
	// wideOnly columns appear only under --wide, narrowOnly ones only
	// without it.
	wideOnly, narrowOnly bool
	// hideIf hides the column in a fitted table when every cell is this
	// (say, STATE when every record listed is open).
	hideIf string
	// keepEnd cuts from the front: queue names share their prefixes and
	// differ at the end.
	keepEnd bool
}

// table renders rows of already printable cells (escape them first: a
// cell's width is counted in runes), fitted to tableWidth unless wide.
type table struct {
	cols []column
	rows [][]string
	wide bool
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer) error {
	var show []int
	for i, c := range t.cols {
		switch {
		case t.wide && c.narrowOnly, !t.wide && c.wideOnly, !t.wide && c.hideIf != "" && t.all(i, c.hideIf):
			continue
		}
		show = append(show, i)
	}
	width := make([]int, len(t.cols))
	for _, i := range show {
		width[i] = utf8.RuneCountInString(t.cols[i].name)
		for _, r := range t.rows {
			width[i] = max(width[i], utf8.RuneCountInString(r[i]))
		}
	}
	if !t.wide {
		used, flex := 2*(len(show)-1), -1
		for _, i := range show {
			c := t.cols[i]
			if c.max == 0 {
				flex = i
				continue
			}
			width[i] = min(width[i], max(c.max, utf8.RuneCountInString(c.name)))
			used += width[i]
		}
		if flex >= 0 {
			width[flex] = min(width[flex], max(tableWidth-used, t.cols[flex].min))
		}
	}
	var b strings.Builder
	line := func(cells func(i int) string) {
		b.Reset()
		for n, i := range show {
			s := fit(cells(i), width[i], t.cols[i].keepEnd)
			b.WriteString(s)
			if n < len(show)-1 {
				b.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(s)+2))
			}
		}
		b.WriteByte('\n')
	}
	line(func(i int) string { return t.cols[i].name })
	// (headings are never cut: every width is at least its heading's)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	for _, r := range t.rows {
		line(func(i int) string { return r[i] })
		if _, err := io.WriteString(w, b.String()); err != nil {
			return err
		}
	}
	return nil
}

func (t *table) all(i int, v string) bool {
	for _, r := range t.rows {
		if r[i] != v {
			return false
		}
	}
	return true
}

// fit cuts s to n runes, the last one (the first, keepEnd) "…" when it
// cut.
func fit(s string, n int, keepEnd bool) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	r := []rune(s)
	if keepEnd {
		return "…" + string(r[len(r)-n+1:])
	}
	return string(r[:n-1]) + "…"
}

// wrap breaks text into lines of at most width runes at spaces (a word
// longer than width stands alone), each ending in a newline.
func wrap(text string, width int) string {
	var b strings.Builder
	n := 0
	for _, word := range strings.Fields(text) {
		l := utf8.RuneCountInString(word)
		if n > 0 && n+1+l > width {
			b.WriteByte('\n')
			n = 0
		}
		if n > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += l
	}
	if n > 0 {
		b.WriteByte('\n')
	}
	return b.String()
}

// kvWriter prints show's key/value rows within tableWidth: values wrap at
// spaces under their column, and a key too long for the key column (a
// producer's header name) stands on a line of its own.
type kvWriter struct {
	w    io.Writer
	rows [][2]string
}

func (k *kvWriter) add(key, value string) { k.rows = append(k.rows, [2]string{key, value}) }

// Flush writes the rows.
func (k *kvWriter) Flush() error {
	const maxKey = 28
	kw := 0
	for _, r := range k.rows {
		if n := utf8.RuneCountInString(r[0]); n <= maxKey {
			kw = max(kw, n)
		}
	}
	indent := strings.Repeat(" ", kw+2)
	var b strings.Builder
	for _, r := range k.rows {
		n := utf8.RuneCountInString(r[0])
		lines := cutLines(r[1], tableWidth-kw-2)
		if n > kw {
			b.WriteString(r[0] + "\n")
		} else {
			b.WriteString(r[0] + strings.Repeat(" ", kw-n+2) + lines[0] + "\n")
			lines = lines[1:]
		}
		for _, l := range lines {
			b.WriteString(indent + l + "\n")
		}
	}
	k.rows = nil
	_, err := io.WriteString(k.w, b.String())
	return err
}

// cutLines cuts s into lines of at most width runes, each at its last
// space when it has one (that space dropped), else at width: unlike wrap it
// keeps every other character, runs of spaces included, as shown.
func cutLines(s string, width int) []string {
	r := []rune(s)
	var out []string
	for len(r) > width {
		cut := width
		for i := width; i > 0; i-- {
			if r[i] == ' ' {
				cut = i
				break
			}
		}
		out = append(out, string(r[:cut]))
		if cut < len(r) && r[cut] == ' ' {
			cut++
		}
		r = r[cut:]
	}
	return append(out, string(r))
}
