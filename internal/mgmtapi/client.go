// Package mgmtapi is the one HTTP client dlxbridge reads RabbitMQ's
// management API (and its Prometheus endpoint) with: GET only, bounded
// bodies, numbers kept exact, and errors that quote neither the URL's
// credentials nor more than a short, escaped part of a refused read's body.
// topology.Management and the audit command both read through it.
package mgmtapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// ErrNotFound is the management API's 404.
var ErrNotFound = errors.New("not found")

// maxBody bounds one answer: a vhost's bindings or consumers come in one
// unpaged list.
const maxBody = 32 << 20

// Client reads one management API. The zero HTTP uses a client with a 10s
// timeout.
type Client struct {
	// BaseURL is e.g. "http://127.0.0.1:15672", without credentials.
	BaseURL        string
	User, Password string
	HTTP           *http.Client
	// requests counts the GETs sent, answered or not.
	requests atomic.Int64
}

// Requests is how many GETs the client has sent.
func (c *Client) Requests() int64 { return c.requests.Load() }

// StatusError is an answer other than 200 and 404.
type StatusError struct {
	Path   string
	Code   int
	Status string
	// Body is the answer's first bytes, printable (see ErrorBody).
	Body string
	// User is the login the API refused, for a 401's message.
	User string
}

func (e *StatusError) Error() string {
	if e.Code == http.StatusUnauthorized && !strings.Contains(e.Body, "virtual host") {
		return fmt.Sprintf("management API GET %s: %s: the API refused the login of user %q (credentials come from the management URL, if it has any: $RABBITMQ_MANAGEMENT_URL, broker.management_url, or audit's --management-url; else from the AMQP URL)", e.Path, e.Status, e.User)
	}
	return fmt.Sprintf("management API GET %s: %s: %s", e.Path, e.Status, e.Body)
}

// Denied reports whether the API refused the read for want of a right (a
// vhost the user has no permissions in, a tag it lacks) rather than for
// another fault.
func (e *StatusError) Denied() bool {
	// A refused login is 401 too, with "Login failed" or "Not_Authorized"
	// (3.10.8, 4.x); a vhost without permissions says so.
	return e.Code == http.StatusForbidden || (e.Code == http.StatusUnauthorized && strings.Contains(e.Body, "virtual host"))
}

// Get reads path (with its query) and decodes the JSON answer into into,
// keeping numbers as json.Number.
func (c *Client) Get(ctx context.Context, path string, into any) error {
	body, err := c.GetBody(ctx, path)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("management API GET %s: %w", path, err)
	}
	return nil
}

// GetBody reads path and returns the answer's body as it came.
func (c *Client) GetBody(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+path, nil)
	if err != nil { // its text quotes the URL
		return nil, &amqpx.URLError{Kind: "management URL", Reason: "no request can be made to it"}
	}
	if c.User != "" || c.Password != "" {
		req.SetBasicAuth(c.User, c.Password)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	c.requests.Add(1)
	resp, err := hc.Do(req)
	if err != nil {
		// A *url.Error quotes the request's URL; keep only its cause,
		// which names at most the host and port.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("management API GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("management API: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, ErrNotFound
	case resp.StatusCode != http.StatusOK:
		return nil, &StatusError{Path: path, Code: resp.StatusCode, Status: resp.Status, Body: ErrorBody(body), User: c.User}
	}
	return body, nil
}

// MaxPageSize is the largest page the management API serves.
const MaxPageSize = 500

// MinPageSize is the smallest page Pages reads: smaller pages cannot start
// a few items before the last one ended and still end past it often enough.
const MinPageSize = 10

// page is one page of a paginated listing.
type page struct {
	Items     []json.RawMessage `json:"items"`
	Page      int               `json:"page"`
	PageCount int               `json:"page_count"`
}

// ErrListingChurn is returned when a listing changed faster than Pages
// could read it without a gap.
var ErrListingChurn = errors.New("the listing changed faster than it could be read without a gap")

// Pages reads a paginated listing (path may carry a query, such as
// columns=..., which must include name) sorted by name, pageSize items at a
// time at most (MaxPageSize if 0), and calls each once for every name it
// sees. It returns how many pages it read.
//
// The API pages by offset, so an item deleted before the cursor between two
// reads shifts the rest left and one would slip past unread. So every page
// after the first starts a few items before the previous one ended and must
// hold one of the names that page ended with; when none is there the
// listing shifted further, and the read steps back twice as far, at worst
// to the first page, which cannot miss anything. Items declared while it
// reads may or may not be seen; an item present throughout always is.
func (c *Client) Pages(ctx context.Context, path string, pageSize int, each func(json.RawMessage) error) (int, error) {
	if pageSize <= 0 || pageSize > MaxPageSize {
		pageSize = MaxPageSize
	}
	pageSize = max(pageSize, MinPageSize)
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	overlap := max(1, pageSize/20)
	seen := map[string]bool{}
	var tail []string // the names the last accepted page ended with
	covered := 0      // offset just past the last accepted page
	back := overlap   // how far before covered the next page must start
	read, budget, maxBudget := 0, 0, 0
	for {
		k, size := 1, pageSize
		if covered > 0 {
			k, size = nextPage(covered-back, pageSize)
		}
		if budget > 0 && read >= budget {
			return read, fmt.Errorf("%s: %w (%d reads)", path, ErrListingChurn, read)
		}
		var p page
		err := c.Get(ctx, fmt.Sprintf("%s%ssort=name&page=%d&page_size=%d&pagination=true", path, sep, k, size), &p)
		read++
		var se *StatusError
		outOfRange := k > 1 && errors.As(err, &se) && se.Code == http.StatusBadRequest && strings.Contains(se.Body, "page_out_of_range")
		if err != nil && !outOfRange {
			return read, err
		}
		// The budget of reads follows the listing's page count: a
		// listing that grows while it is read (queues declared after the
		// cursor) needs more pages and shifts nothing. It stops at four
		// times the first page's, so that a listing growing as fast as
		// it is read still ends, as churn.
		if first := 3*max(1, p.PageCount) + 10; budget == 0 {
			budget, maxBudget = first, 4*first
		} else {
			budget = min(max(budget, first), maxBudget)
		}
		names := make([]string, len(p.Items))
		for i, it := range p.Items {
			var n struct {
				Name *string `json:"name"`
			}
			if err := json.Unmarshal(it, &n); err != nil || n.Name == nil {
				return read, fmt.Errorf("%s: an item without a name: %s", path, ErrorBody(it))
			}
			names[i] = *n.Name
		}
		if k > 1 && (outOfRange || !holdsAny(names, tail)) {
			// Shifted past the overlap (or the listing shrank below
			// this page): step back further.
			back = min(2*back, covered, pageSize-1)
			if back == pageSize-1 {
				back = covered // no overlap within a page held: start over
			}
			continue
		}
		for i, it := range p.Items {
			if seen[names[i]] {
				continue
			}
			seen[names[i]] = true
			if err := each(it); err != nil {
				return read, err
			}
		}
		if k >= p.PageCount || len(p.Items) < size {
			return read, nil
		}
		covered = (k-1)*size + len(p.Items)
		tail = names[max(0, len(names)-2*overlap):]
		// Keep most of the overlap a busy listing needed: its churn
		// goes on.
		back = max(overlap, back/2)
	}
}

// nextPage picks the page number and size whose page starts at or before
// offset from and reaches furthest: the API serves page k of size s as
// offsets [(k-1)s, ks). The first page always qualifies.
func nextPage(from, maxSize int) (k, size int) {
	k, size = 1, maxSize
	if from <= 0 {
		return k, size
	}
	bestEnd := maxSize
	for k1 := max(1, from/maxSize); k1 <= from/maxSize+2*maxSize && k1 <= from; k1++ {
		s := min(maxSize, from/k1)
		if end := (k1 + 1) * s; end > bestEnd {
			bestEnd, k, size = end, k1+1, s
		}
	}
	return k, size
}

func holdsAny(names, want []string) bool {
	for _, n := range names {
		if slices.Contains(want, n) {
			return true
		}
	}
	return false
}

// maxErrorBody is how much of a refused read's body an error quotes.
const maxErrorBody = 512

// ErrorBody is a refused read's body as an error quotes it: its first
// maxErrorBody bytes, as a Go string literal when they hold anything
// unprintable. The body may be a proxy's error page, and the error ends up
// in reports on an operator's terminal: it must neither fill them nor
// drive the terminal (title, screen, a faked line).
func ErrorBody(body []byte) string {
	s, cut := strings.TrimSpace(string(body)), false
	if len(s) > maxErrorBody {
		n := maxErrorBody
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s, cut = s[:n], true
	}
	if !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		s = strconv.Quote(s)
	}
	if cut {
		s += " (cut)"
	}
	return s
}
