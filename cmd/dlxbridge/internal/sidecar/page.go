package sidecar

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/payload"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
)

//go:embed page.html
var pageHTML string

var pageTemplates = template.Must(template.New("page").Funcs(template.FuncMap{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	},
	"dur": func(d quarantine.Seconds) string { return time.Duration(d).Round(time.Second).String() },
}).Parse(pageHTML))

// Page defaults: what a replay from the page does unless the operator
// chooses otherwise.
const (
	// PageDefaultRate is a page replay's pace, messages per second.
	PageDefaultRate = 20
	// PageDefaultMax caps a page replay or purge (0 would be no cap).
	PageDefaultMax = 1000
	// pageRecords bounds the records a group view lists.
	pageRecords = 200
	// pagePayload bounds the payload bytes a record view shows.
	pagePayload = 64 << 10
	// TokenHeader carries the operator token for clients other than the
	// page's own forms.
	TokenHeader = "X-Dlxbridge-Token"
)

// Page serves the quarantine page: GET /quarantine (the stats groups),
// /quarantine/group (one group's records), /quarantine/record/{id} (one
// record's envelope, headers and payload), and, only when Token is set,
// POST /quarantine/replay and /quarantine/purge. Every request reads the
// quarantine afresh over a connection of its own (the CLI's Inspector) and
// closes it; replays and purges run through the CLI's Replayer with its
// filters, rate, budget, schema check, lock and audit events.
type Page struct {
	// Dial opens the AMQP connection one request uses. Required.
	Dial func() (*amqp.Connection, error)
	// Config names the quarantines, owners and budgets. Required.
	Config *config.Config
	// Registry is the schema registry replays check payloads against.
	// Required when Token is set.
	Registry *schemas.Registry
	// Token, when set, enables replay and purge for a request that carries
	// it (form field "token" or the X-Dlxbridge-Token header; never a
	// cookie, so another site cannot make a browser send it). Defaults to
	// "": read-only, and the POST endpoints answer 403.
	Token string
	// AllowedHosts are Host values, besides the address the page is
	// reached on, that it answers: host:port, or a host for any port
	// (run.allowed_hosts). Defaults to none.
	AllowedHosts []string
	// LockWait is how long a replay or purge waits for another one of the
	// same quarantine. Defaults to 10s.
	LockWait time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// now is the clock of confirmations and the failure limiter; tests
	// set it. Defaults to time.Now.
	now func() time.Time

	fails    failLimiter
	confirms confirmations
}

// Mount adds the page's routes to mux.
func (p *Page) Mount(mux *http.ServeMux) {
	mux.HandleFunc("GET /quarantine", p.guarded(p.stats))
	mux.HandleFunc("GET /quarantine/group", p.guarded(p.group))
	mux.HandleFunc("GET /quarantine/record/{id}", p.guarded(p.record))
	mux.HandleFunc("POST /quarantine/replay", p.guarded(p.act))
	mux.HandleFunc("POST /quarantine/purge", p.guarded(p.act))
}

// Handler returns the page's routes on a mux of their own.
func (p *Page) Handler() http.Handler {
	mux := http.NewServeMux()
	p.Mount(mux)
	return mux
}

func (p *Page) clock() time.Time {
	if p.now != nil {
		return p.now()
	}
	return time.Now()
}

func (p *Page) log() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.Default()
}

// view is what every template gets.
type view struct {
	Title    string
	Actions  bool // a token is configured: forms are rendered
	Snapshot *quarantine.Snapshot
	Groups   []groupRow
	Group    *groupRow
	Records  []*quarantine.Record
	Shown    int
	Total    int
	Record   *recordView
	Result   *actionView
	Error    string
}

type groupRow struct {
	quarantine.Group
	Link  string
	Query url.Values
}

type recordView struct {
	R         *quarantine.Record
	Owner     string
	Headers   []headerRow
	Payload   string
	Base64    bool
	Size      int
	Truncated bool
	History   []*quarantine.Record
}

type headerRow struct{ Key, Value string }

// actionView is a dry run waiting for its confirmation, or an outcome.
type actionView struct {
	Kind       string // "replay" or "purge"
	DryRun     bool
	Sel        selection
	IDs        string // the dry run's ids, comma-separated, for the confirm
	Plan       []quarantine.Planned
	Purge      []string
	Selected   int
	Sent       []string
	Invalid    []string
	OverBudget []string
	Stopped    bool
	Run        string
	// Confirmation is the dry run's single-use confirmation id: the
	// confirm form carries it instead of the token.
	Confirmation string
	Sendable     int
	ConfirmNote  string
}

// selection is one group and the operator's choices, as the forms carry it.
type selection struct {
	Queue, Class, Fingerprint string
	Max                       int
	Rate                      float64
	Reason, By                string
	SkipInvalid               bool
}

func (p *Page) render(w http.ResponseWriter, status int, v *view) {
	v.Actions = p.Token != ""
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	// Rendered whole before anything is sent: a template error must answer
	// 500, not a 200 with half a page that looks like an empty quarantine.
	var buf bytes.Buffer
	if err := pageTemplates.ExecuteTemplate(&buf, "page", v); err != nil {
		p.log().Warn("quarantine page: render", "error", err)
		http.Error(w, "the quarantine page could not be rendered; see the log", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

func (p *Page) fail(w http.ResponseWriter, status int, err error) {
	p.render(w, status, &view{Title: "Error", Error: err.Error()})
}

// snapshot reads the quarantine over a connection of its own.
func (p *Page) snapshot(ctx context.Context) (*quarantine.Snapshot, error) {
	conn, err := p.Dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return (&quarantine.Inspector{Conn: conn, Config: p.Config}).Snapshot(ctx)
}

func groupQuery(queue, class, fingerprint string) url.Values {
	return url.Values{"queue": {queue}, "class": {class}, "fingerprint": {fingerprint}}
}

func (p *Page) stats(w http.ResponseWriter, r *http.Request) {
	snap, err := p.snapshot(r.Context())
	if err != nil {
		p.fail(w, http.StatusBadGateway, err)
		return
	}
	v := &view{Title: "Quarantine", Snapshot: snap}
	for _, g := range snap.Stats(quarantine.Filter{}) {
		q := groupQuery(g.Queue, g.Class, g.Fingerprint)
		v.Groups = append(v.Groups, groupRow{Group: g, Link: "/quarantine/group?" + q.Encode(), Query: q})
	}
	p.render(w, http.StatusOK, v)
}

// inGroup: the records of exactly one queue, class and fingerprint (a
// Filter matches fingerprints by prefix, and an empty field matches all).
func inGroup(snap *quarantine.Snapshot, queue, class, fingerprint string, states ...quarantine.State) []*quarantine.Record {
	var out []*quarantine.Record
	for _, r := range snap.List(quarantine.Filter{Queue: queue, Class: class, Fingerprint: fingerprint, States: states}) {
		if r.Queue == queue && string(r.Envelope.Class) == class && r.Envelope.Fingerprint == fingerprint {
			out = append(out, r)
		}
	}
	return out
}

var allStates = []quarantine.State{quarantine.StateOpen, quarantine.StateReplayed, quarantine.StatePurged, quarantine.StateExpired}

func (p *Page) group(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	queue, class, fp := q.Get("queue"), q.Get("class"), q.Get("fingerprint")
	if queue == "" {
		p.fail(w, http.StatusBadRequest, errors.New("a group needs its queue"))
		return
	}
	snap, err := p.snapshot(r.Context())
	if err != nil {
		p.fail(w, http.StatusBadGateway, err)
		return
	}
	var row *groupRow
	for _, g := range snap.Stats(quarantine.Filter{Queue: queue, Class: class, Fingerprint: fp}) {
		if g.Queue == queue && g.Class == class && g.Fingerprint == fp {
			row = &groupRow{Group: g, Query: groupQuery(queue, class, fp)}
		}
	}
	if row == nil {
		p.fail(w, http.StatusNotFound, fmt.Errorf("no records in queue %q, class %q, fingerprint %q", queue, class, fp))
		return
	}
	recs := inGroup(snap, queue, class, fp, allStates...)
	v := &view{Title: "Group " + fp, Snapshot: snap, Group: row, Total: len(recs),
		Result: &actionView{Sel: selection{Queue: queue, Class: class, Fingerprint: fp, Max: PageDefaultMax, Rate: PageDefaultRate}}}
	if len(recs) > pageRecords {
		recs = recs[:pageRecords]
	}
	v.Records, v.Shown = recs, len(recs)
	p.render(w, http.StatusOK, v)
}

func (p *Page) record(w http.ResponseWriter, r *http.Request) {
	snap, err := p.snapshot(r.Context())
	if err != nil {
		p.fail(w, http.StatusBadGateway, err)
		return
	}
	rec, err := snap.Get(r.PathValue("id"))
	if err != nil {
		p.fail(w, http.StatusNotFound, err)
		return
	}
	rv := &recordView{R: rec, Owner: strings.TrimSpace(rec.Owner.Team + " " + rec.Owner.Contact), Size: len(rec.Body), History: snap.History(rec)}
	h := rec.Headers()
	for k, val := range h {
		rv.Headers = append(rv.Headers, headerRow{k, fmt.Sprintf("%v", val)})
	}
	sort.Slice(rv.Headers, func(i, j int) bool { return rv.Headers[i].Key < rv.Headers[j].Key })
	body := rec.Body
	if len(body) > pagePayload {
		body, rv.Truncated = body[:pagePayload], true
		// Cut back to a whole rune.
		for i := 0; i < utf8.UTFMax && len(body) > 0 && !utf8.Valid(body); i++ {
			body = body[:len(body)-1]
		}
	}
	if payload.IsText(body) {
		rv.Payload = string(body)
	} else {
		rv.Payload, rv.Base64 = base64.StdEncoding.EncodeToString(body), true
	}
	p.render(w, http.StatusOK, &view{Title: "Record " + rec.ID, Snapshot: snap, Record: rv})
}

// authorized compares the request's token with the configured one (their
// digests, in constant time). No token configured: nobody is.
func (p *Page) authorized(r *http.Request) bool {
	if p.Token == "" {
		return false
	}
	got := r.Header.Get(TokenHeader)
	if got == "" {
		got = r.PostFormValue("token")
	}
	return tokenMatches(got, p.Token)
}

// ErrConfirmation is the answer to a confirmation that is unknown, used,
// expired or for the other action.
var ErrConfirmation = errors.New("forbidden: this confirmation is unknown, already used, expired or for another action: run the dry run again")

// ErrReadOnly is the answer to a replay or purge without a valid token.
var ErrReadOnly = errors.New("forbidden: the quarantine page is read-only without the operator token (run.operator_token_env)")

// act is POST /quarantine/replay and /quarantine/purge. Without "confirm"
// it is a dry run that lists exactly what would move; the confirm form
// carries the same selection and the dry run's ids, and only those move.
func (p *Page) act(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<20)
	kind := strings.TrimPrefix(r.URL.Path, "/quarantine/")
	client, now := clientKey(r.RemoteAddr), p.clock()
	if ok, wait := p.fails.allow(client, now); !ok && p.Token != "" {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
		p.fail(w, http.StatusTooManyRequests, fmt.Errorf("too many refused operator tokens from %s: try again in %s", client, (wait+time.Second).Round(time.Second)))
		return
	}
	// A confirmation from the page's dry run stands for the token, and
	// brings the dry run's selection and records with it.
	var confirmed *pending
	if id := r.PostFormValue("confirmation"); id != "" && p.Token != "" {
		if pd, ok := p.confirms.take(id, kind, now); ok {
			confirmed = pd
		}
	}
	if confirmed == nil && !p.authorized(r) {
		if logNow, unlogged := p.fails.failed(client, now); logNow {
			p.log().Warn("quarantine page: refused an action", "path", r.URL.Path, "remote", r.RemoteAddr, "token_configured", p.Token != "", "refusals_unlogged", unlogged)
		}
		err := ErrReadOnly
		if r.PostFormValue("confirmation") != "" {
			err = ErrConfirmation
		}
		p.fail(w, http.StatusForbidden, err)
		return
	}
	sel, err := parseSelection(r)
	if confirmed != nil {
		sel, err = confirmed.sel, nil
	}
	if err != nil {
		p.fail(w, http.StatusBadRequest, err)
		return
	}
	if kind == "purge" && strings.TrimSpace(sel.Reason) == "" {
		p.fail(w, http.StatusBadRequest, fmt.Errorf("%w (the reason field)", quarantine.ErrNoReason))
		return
	}
	confirm := r.PostFormValue("confirm") != "" || confirmed != nil
	filter := quarantine.Filter{Queue: sel.Queue, Class: sel.Class, Fingerprint: sel.Fingerprint}
	if kind == "purge" {
		filter.States = []quarantine.State{quarantine.StateOpen, quarantine.StateExpired}
	}
	av := &actionView{Kind: kind, DryRun: !confirm, Sel: sel}
	if confirmed != nil {
		filter.IDs = confirmed.ids
	} else if confirm {
		for _, id := range strings.Split(r.PostFormValue("ids"), ",") {
			if id = strings.TrimSpace(id); id != "" {
				filter.IDs = append(filter.IDs, id)
			}
		}
		if len(filter.IDs) == 0 {
			p.fail(w, http.StatusBadRequest, errors.New("the confirmation names no records: run the dry run again"))
			return
		}
	} else {
		// The dry run selects the group's records by id, so that it lists
		// exactly the group (not every fingerprint it prefixes).
		snap, err := p.snapshot(r.Context())
		if err != nil {
			p.fail(w, http.StatusBadGateway, err)
			return
		}
		for _, rec := range inGroup(snap, sel.Queue, sel.Class, sel.Fingerprint, filter.States...) {
			filter.IDs = append(filter.IDs, rec.ID)
		}
		if len(filter.IDs) == 0 {
			p.render(w, http.StatusOK, &view{Title: kind, Result: av})
			return
		}
	}
	conn, err := p.Dial()
	if err != nil {
		p.fail(w, http.StatusBadGateway, err)
		return
	}
	defer conn.Close()
	lockWait := p.LockWait
	if lockWait == 0 {
		lockWait = 10 * time.Second
	}
	by := "web"
	if sel.By != "" {
		by = "web:" + sel.By
	}
	rp := &quarantine.Replayer{Conn: conn, Config: p.Config, Registry: p.Registry, By: by, LockWait: lockWait}
	status := http.StatusOK
	if kind == "purge" {
		res, err := rp.Purge(r.Context(), quarantine.PurgeOptions{Filter: filter, Reason: sel.Reason, DryRun: !confirm, Max: sel.Max})
		if err != nil {
			p.fail(w, http.StatusConflict, err)
			return
		}
		av.Purge, av.Selected, av.Run = res.Purged, res.Selected, res.Run
		av.IDs, av.Sendable = strings.Join(res.Purged, ","), len(res.Purged)
	} else {
		reason := sel.Reason
		if reason == "" {
			reason = "replayed from the dlxbridge quarantine page"
		}
		res, err := rp.Replay(r.Context(), quarantine.ReplayOptions{Filter: filter, DryRun: !confirm, Max: sel.Max,
			Rate: sel.Rate, Reason: reason, SkipInvalid: sel.SkipInvalid})
		if res == nil {
			p.fail(w, http.StatusConflict, err)
			return
		}
		if err != nil {
			av.ConfirmNote = err.Error()
			status = http.StatusConflict
		}
		av.Plan, av.Selected, av.Sent, av.Invalid, av.OverBudget, av.Stopped, av.Run =
			res.Plan, res.Selected, res.Sent, res.Invalid, res.OverBudget, res.Stopped, res.Run
		var ids []string
		for _, pl := range res.Plan {
			if pl.Refused == "" {
				ids = append(ids, pl.ID)
			}
		}
		av.IDs, av.Sendable = strings.Join(ids, ","), len(ids)
	}
	if !confirm && av.Sendable > 0 {
		av.Confirmation = p.confirms.issue(kind, sel, strings.Split(av.IDs, ","), now)
	}
	if confirm {
		p.log().Info("quarantine page: "+kind, "by", by, "filter", filter.String(), "run", av.Run,
			"selected", av.Selected, "sent", len(av.Sent), "purged", len(av.Purge))
	}
	p.render(w, status, &view{Title: kind, Result: av})
}

func parseSelection(r *http.Request) (selection, error) {
	s := selection{Queue: r.PostFormValue("queue"), Class: r.PostFormValue("class"), Fingerprint: r.PostFormValue("fingerprint"),
		Reason: strings.TrimSpace(r.PostFormValue("reason")), By: frame.Truncate(strings.TrimSpace(r.PostFormValue("by")), 64),
		SkipInvalid: r.PostFormValue("skip_invalid") != "", Max: PageDefaultMax, Rate: PageDefaultRate}
	if s.Queue == "" {
		return s, fmt.Errorf("%w (the queue field)", quarantine.ErrNoSelector)
	}
	if v := r.PostFormValue("max"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return s, fmt.Errorf("max: %q is not a count", v)
		}
		s.Max = n
	}
	if v := r.PostFormValue("rate"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 10000 {
			return s, fmt.Errorf("rate: %q is not a rate between 0 and 10000 per second", v)
		}
		s.Rate = f
	}
	return s, nil
}
