package mgmtapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
)

// listing is a fake management API's paginated, name-sorted listing that
// churn changes after every read.
type listing struct {
	mu    sync.Mutex
	names []string
	churn func(read int, names []string) []string
	reads int
}

func (l *listing) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := r.URL.Query()
	page, _ := strconv.Atoi(q.Get("page"))
	size, _ := strconv.Atoi(q.Get("page_size"))
	if q.Get("columns") != "name" || q.Get("pagination") != "true" || q.Get("sort") != "name" || page < 1 || size < 1 || size > mgmtapi.MaxPageSize {
		http.Error(w, "bad query "+r.URL.RawQuery, http.StatusBadRequest)
		return
	}
	l.reads++
	defer func() {
		if l.churn != nil {
			l.names = l.churn(l.reads, l.names)
			slices.Sort(l.names)
		}
	}()
	count := max(1, (len(l.names)+size-1)/size)
	if page > count {
		http.Error(w, `{"error":"page_out_of_range","reason":"Page out of range"}`, http.StatusBadRequest)
		return
	}
	var items []string
	for i := (page - 1) * size; i < min(len(l.names), page*size); i++ {
		items = append(items, fmt.Sprintf(`{"name":%q}`, l.names[i]))
	}
	fmt.Fprintf(w, `{"page":%d,"page_count":%d,"items":[%s]}`, page, count, strings.Join(items, ","))
}

func readAll(t *testing.T, l *listing, size int) ([]string, int, error) {
	t.Helper()
	srv := httptest.NewServer(l)
	defer srv.Close()
	c := &mgmtapi.Client{BaseURL: srv.URL}
	var names []string
	pages, err := c.Pages(context.Background(), "/api/queues/%2F?columns=name", size, func(raw json.RawMessage) error {
		var q struct{ Name string }
		if err := json.Unmarshal(raw, &q); err != nil {
			return err
		}
		names = append(names, q.Name)
		return nil
	})
	return names, pages, err
}

func names(prefix string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s%04d", prefix, i))
	}
	return out
}

// A still listing is read in whole pages, each a little before the last
// ended, every name once.
func TestPagesReadsAStillListingOnce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ n, size, most int }{
		{0, 20, 1}, {1, 20, 1}, {19, 20, 1}, {20, 20, 2}, {21, 20, 2}, {100, 20, 7}, {1234, 20, 90},
		{499, 0, 1}, {1000, 0, 3}, {5000, 0, 12}, {20000, 0, 45},
	} {
		l := &listing{names: names("q", c.n)}
		got, pages, err := readAll(t, l, c.size)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, names("q", c.n)) {
			t.Errorf("%d items: read %d", c.n, len(got))
		}
		if pages > c.most {
			t.Errorf("%d items: %d pages of %d, want at most %d", c.n, pages, c.size, c.most)
		}
	}
}

// Queues deleted before the cursor between reads shift the rest left; the
// overlap sees that and steps back, so no queue present throughout is
// missed. This is the failure a paged audit of a busy vhost had: 8 of 510
// queues missing while other tests deleted theirs.
func TestPagesMissesNothingWhileItemsBeforeTheCursorGo(t *testing.T) {
	t.Parallel()
	stable := names("s", 300)
	for _, drop := range []int{1, 3, 10, 40, 200} {
		l := &listing{names: append(names("a", 400), stable...)}
		l.churn = func(_ int, ns []string) []string {
			// delete drop of the "a" items (which sort first), add some
			// that sort last
			out := ns[:0:0]
			gone := 0
			for _, n := range ns {
				if strings.HasPrefix(n, "a") && gone < drop {
					gone++
					continue
				}
				out = append(out, n)
			}
			return append(out, fmt.Sprintf("z%06d", len(ns)))
		}
		got, _, err := readAll(t, l, 20)
		if err != nil {
			t.Fatalf("drop %d: %v", drop, err)
		}
		for _, s := range stable {
			if !slices.Contains(got, s) {
				t.Fatalf("drop %d per read: %s missed", drop, s)
			}
		}
		if dup := len(got) - len(uniq(got)); dup != 0 {
			t.Errorf("drop %d: %d names handed over twice", drop, dup)
		}
	}
}

// Random churn of every kind: whatever is present throughout is read, once.
func TestPagesUnderRandomChurn(t *testing.T) {
	t.Parallel()
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 1))
		stable := names("m", 150+rng.IntN(300))
		start := append(slices.Clone(stable), names("c", rng.IntN(300))...)
		next := 0
		size := 20 + rng.IntN(100)
		l := &listing{names: start, churn: func(_ int, ns []string) []string {
			// up to a quarter of a page's worth of each per read
			for range rng.IntN(size/4 + 1) {
				i := rng.IntN(len(ns))
				if !strings.HasPrefix(ns[i], "m") {
					ns = slices.Delete(ns, i, i+1)
				}
			}
			for range rng.IntN(size/4 + 1) {
				next++
				ns = append(ns, fmt.Sprintf("%c%06d", "bdnz"[rng.IntN(4)], next))
			}
			return ns
		}}
		got, _, err := readAll(t, l, size)
		if err != nil {
			t.Fatalf("seed %d, pages of %d, %d items: %v", seed, size, len(start), err)
		}
		for _, s := range stable {
			if !slices.Contains(got, s) {
				t.Fatalf("seed %d, pages of %d: %s missed", seed, size, s)
			}
		}
		if len(uniq(got)) != len(got) {
			t.Errorf("seed %d: a name handed over twice", seed)
		}
	}
}

// A listing that shrinks below the next page (the broker refuses it with
// page_out_of_range) steps back rather than ending with what shifted left
// unread.
func TestPagesStepsBackWhenTheListingShrinks(t *testing.T) {
	t.Parallel()
	l := &listing{names: append(names("a", 30), names("s", 11)...)}
	l.churn = func(read int, ns []string) []string {
		if read == 1 {
			return ns[25:] // 25 of the "a" go after the first page
		}
		return ns
	}
	got, _, err := readAll(t, l, 20)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range names("s", 11) {
		if !slices.Contains(got, s) {
			t.Errorf("%s missed: read %q", s, got)
		}
	}
}

// A listing that never holds still ends in ErrListingChurn, not a loop.
func TestPagesGivesUpOnAListingThatNeverHoldsStill(t *testing.T) {
	t.Parallel()
	gen := 0
	l := &listing{names: names("x", 100), churn: func(int, []string) []string {
		gen++
		return names(fmt.Sprintf("g%06d-", gen), 100) // every name replaced
	}}
	_, pages, err := readAll(t, l, 20)
	if !errors.Is(err, mgmtapi.ErrListingChurn) {
		t.Fatalf("err %v after %d pages, want ErrListingChurn", err, pages)
	}
}

// A listing that grows while it is read (another application declaring
// queues: seen in the suite, 510 queues declared beside an audit paged by
// 10) is read to its end: insertions shift nothing past the cursor, and a
// budget of reads set by the first page's count must not call that churn.
func TestPagesReadsAListingThatGrows(t *testing.T) {
	t.Parallel()
	l := &listing{names: names("a", 50), churn: func(read int, ns []string) []string {
		return append(ns, names(fmt.Sprintf("z%04d-", read), 5)...) // after the cursor
	}}
	got, pages, err := readAll(t, l, 10)
	if err != nil {
		t.Fatalf("after %d pages: %v", pages, err)
	}
	for _, n := range names("a", 50) {
		if !slices.Contains(got, n) {
			t.Fatalf("%s missing", n)
		}
	}
	if len(uniq(got)) != len(got) {
		t.Errorf("names seen twice: %d of %d unique", len(uniq(got)), len(got))
	}
}

func uniq(s []string) []string {
	m := map[string]bool{}
	var out []string
	for _, x := range s {
		if !m[x] {
			m[x] = true
			out = append(out, x)
		}
	}
	return out
}

func TestStatusErrorsSayWhetherARightIsMissing(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/vhost":
			http.Error(w, `{"error":"not_authorised","reason":"User not authorised to access virtual host"}`, http.StatusUnauthorized)
		case "/login":
			http.Error(w, `{"error":"not_authorized","reason":"Login failed"}`, http.StatusUnauthorized)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c := &mgmtapi.Client{BaseURL: srv.URL, User: "u", Password: "secret-pw"}
	var se *mgmtapi.StatusError
	err := c.Get(context.Background(), "/vhost", &struct{}{})
	if !errors.As(err, &se) || !se.Denied() || strings.Contains(err.Error(), "refused the login") {
		t.Errorf("vhost refusal: %v", err)
	}
	err = c.Get(context.Background(), "/login", &struct{}{})
	if !errors.As(err, &se) || se.Denied() || !strings.Contains(err.Error(), `refused the login of user "u"`) || strings.Contains(err.Error(), "secret-pw") {
		t.Errorf("login refusal: %v", err)
	}
	if err := c.Get(context.Background(), "/other", &struct{}{}); !errors.Is(err, mgmtapi.ErrNotFound) {
		t.Errorf("404: %v", err)
	}
}
