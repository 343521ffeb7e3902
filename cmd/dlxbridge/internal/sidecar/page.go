package sidecar

import (
	"bytes"
	"context"
	"crypto/sha256"
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
	"sync"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/internal/payload"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
)

//go:embed page.html
var pageHTML string

var pageTemplates = template.Must(template.New("page").Funcs(template.FuncMap{
	"rfc3339": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"dur":     func(d quarantine.Seconds) string { return compact(time.Duration(d)) },
	"verdict": envelopeVerdict,
	"signed":  eventVerdict,
	"shorten": shorten,
	"add":     func(a, b int) int { return a + b },
	"dec":     func(a int) int { return a - 1 },
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
	// pageGroups bounds the groups the overview lists (after its sort;
	// the totals count them all).
	pageGroups = 100
	// pickedMax bounds the ticked records of one action.
	pickedMax = 1000
	// pagePayload bounds the payload bytes a record view shows.
	pagePayload = 64 << 10
	// TokenHeader carries the operator token for clients other than the
	// page's own forms.
	TokenHeader = "X-Dlxbridge-Token"
)

// Page serves the quarantine page: GET /quarantine (the stats groups),
// /quarantine/group (one group's records), /quarantine/record/{id} (one
// record's envelope, headers and payload), and, only when Token is set,
// POST /quarantine/replay and /quarantine/purge. Listings come from one
// snapshot without payloads that concurrent requests share, a record page
// reads its one payload, and the requests served at once are capped (see
// pageload.go); replays and purges run through the CLI's Replayer with its
// filters, rate, budget, schema check, lock and audit events. Every view
// says whether a record's envelope was verified, as the CLI marks it.
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
	// Signer, with the signing key (security.signing_key_env), checks the
	// events the page reads (an unsigned one after a signed one changes
	// nothing; one not verified is marked) and signs the events and
	// messages of its replays and purges, as the CLI's with the key.
	// Defaults to nil: every event counts, none verified, and the page's
	// own events are unsigned, which readers with the key ignore once a
	// stream holds a signed event.
	Signer *triage.Signer
	// LockWait is how long a replay or purge waits for another one of the
	// same quarantine. Defaults to 10s.
	LockWait time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// now is the clock of confirmations and the failure limiter; tests
	// set it. Defaults to time.Now.
	now func() time.Time

	// read, in tests, replaces the shared snapshot's broker read.
	read func(context.Context) (*quarantine.Snapshot, error)
	// limits, in tests, replaces the defaults of pageload.go.
	limits pageLimits

	fails    failLimiter
	confirms confirmations
	loadOnce sync.Once
	load     *pageLoad
	// bg: the replays running in the background (see Close).
	bg pageBackground
}

// Mount adds the page's routes to mux.
func (p *Page) Mount(mux *http.ServeMux) {
	mux.HandleFunc("GET /quarantine", p.guarded(p.limited(p.stats)))
	mux.HandleFunc("GET /quarantine/group", p.guarded(p.limited(p.group)))
	mux.HandleFunc("GET /quarantine/record/{id}", p.guarded(p.limited(p.record)))
	mux.HandleFunc("GET /quarantine/audit", p.guarded(p.limited(p.audit)))
	mux.HandleFunc("POST /quarantine/replay", p.guarded(p.limited(p.act)))
	mux.HandleFunc("POST /quarantine/purge", p.guarded(p.limited(p.act)))
	mux.HandleFunc("GET /quarantine/jobs", p.guarded(p.limited(p.jobs)))
	mux.HandleFunc("POST /quarantine/jobs/cancel", p.guarded(p.limited(p.cancelJob)))
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
	CSS      template.CSS
	Snapshot *quarantine.Snapshot
	// Refresh, in seconds, reloads the page (0: never).
	Refresh int
	// The overview's filter, its choices, totals and timeline window.
	Query   overviewQuery
	Choices filterChoices
	Totals  totals
	Window  window
	Groups  []groupRow
	// A group's page: the group, its records, and the overview it came
	// from.
	Group    *groupRow
	Rows     []recordRow
	Back     string
	Shown    int
	Total    int
	Record   *recordView
	Result   *actionView
	Audit    *auditView
	Jobs     *jobsView
	Error    string
	ErrorFix string
}

type groupRow struct {
	quarantine.Group
	Link  string
	Query url.Values
	// Envelopes counts the group's records by verdict.
	Envelopes verdictCounts
	// Short is the example error on one line, cut for the overview.
	Short    string
	Timeline timeline
}

// verdict is how far a record's envelope is the runtime's word, as the
// CLI says it (list's "?" and "(unverified)" after the class, show's
// envelope line). The page is where operators decide to replay: a claimed
// envelope must not look like a signed one.
type verdict struct {
	Kind  string // verified, claimed, unverified or broker (the cell's class)
	Mark  string // after the class, as list marks it: "?", "(unverified)" or ""
	Label string // a few words for a table cell
	Title string // the sentence show writes
}

func envelopeVerdict(e quarantine.Envelope) verdict {
	switch {
	case e.Verified:
		return verdict{"verified", "", "signed", "signed by the runtime (signature verified when stored)"}
	case e.Source == quarantine.SourceBridge:
		return verdict{"claimed", "?", "claimed, not verified", "NOT verified: no valid envelope signature was checked (stored before envelopes were signed, or by a keeper without the consumers' key); every field is the message's claim"}
	case e.Source == quarantine.SourceBroker:
		return verdict{"broker", "", "broker dead letter", "none: read from the broker's x-death (not verified)"}
	}
	return verdict{"unverified", "(unverified)", "signature did not verify", "NOT verified: an envelope no valid signature vouches for; see the notes"}
}

// eventVerdict is the audit trail's Signed cell for e, as `quarantine
// audit` marks it in its SIGNED column ("yes", "?", "UNSIGNED"): a forged
// event in the events stream must not read like an operator's.
func eventVerdict(e quarantine.Event) verdict {
	switch {
	case e.Verified:
		return verdict{Kind: "verified", Label: "signed"}
	case e.Ignored:
		return verdict{Kind: "ignored", Label: "UNSIGNED: ignored", Title: e.Unverified}
	}
	return verdict{Kind: "unverified", Label: "not verified ?", Title: e.Unverified}
}

// verdictCounts are a group's records by verdict.
type verdictCounts struct{ Verified, Claimed, Unverified, Broker int }

// Marked is how many of them the CLI would mark ("?" or "(unverified)").
func (c verdictCounts) Marked() int { return c.Claimed + c.Unverified }

// countVerdicts counts every listed record of snap by group and verdict
// (records the broker's retention removed have no envelope left to judge).
func countVerdicts(snap *quarantine.Snapshot) map[[3]string]verdictCounts {
	out := map[[3]string]verdictCounts{}
	for _, r := range snap.Records {
		k := [3]string{r.Queue, string(r.Envelope.Class), r.Envelope.Fingerprint}
		c := out[k]
		switch envelopeVerdict(r.Envelope).Kind {
		case "verified":
			c.Verified++
		case "claimed":
			c.Claimed++
		case "broker":
			c.Broker++
		default:
			c.Unverified++
		}
		out[k] = c
	}
	return out
}

type recordView struct {
	R         *quarantine.Record
	Owner     string
	Age       string
	Headers   []headerRow
	Payload   string
	Base64    bool
	Size      int
	Truncated bool
	// Pretty: Payload is the JSON payload indented; Raw: the operator
	// asked for it as received; CanPretty: it is JSON that indents.
	Pretty, Raw, CanPretty bool
	History                []historyRow
	GroupLink              string
	Sel                    selection
	// Replayable, Purgeable: the record's state lets that action pick it.
	Replayable, Purgeable bool
}

// auditView is the audit page: one page of events, newest first.
type auditView struct {
	Q       auditQuery
	Rows    []auditRow
	Matched int
	From    int // the 1-based position of the first row
	Older   string
	Newer   string
	Queues  []string
	Kinds   []string
}

type headerRow struct{ Key, Value string }

// actionView is a dry run waiting for its confirmation, or an outcome.
type actionView struct {
	Kind       string // "replay" or "purge"
	DryRun     bool
	Sel        selection
	IDs        string // the dry run's ids, comma-separated, for the confirm
	Plan       []planRow
	Purge      []string
	Selected   int
	Sent       []string
	Invalid    []string
	OverBudget []string
	Stopped    bool
	Run        string
	// Running: the replay goes on in the background (see replayDetached).
	Running bool
	// Confirmation is the dry run's single-use confirmation id: the
	// confirm form carries it instead of the token.
	Confirmation string
	Sendable     int
	ConfirmNote  string
	// Unverified counts the records to send whose envelope the CLI marks.
	Unverified int
	// Dropped are ticked ids that are no record of the group this action
	// may take (resolved meanwhile, or never in it).
	Dropped []string
}

// planRow is one record of a replay's plan, with its envelope's verdict
// (nil when the page's snapshot does not have the record).
type planRow struct {
	quarantine.Planned
	Verdict *verdict
}

// selection is one group and the operator's choices, as the forms carry it.
type selection struct {
	Queue, Class, Fingerprint string
	// Picked are the records of the group the operator ticked; none: every
	// record of the group the action may take.
	Picked      []string
	Max         int
	Rate        float64
	Reason, By  string
	SkipInvalid bool
}

//go:embed page.css
var pageCSS string

// pageCSP lets nothing but the page's own stylesheet apply (by its hash:
// no style attribute, no other style element) and runs no script at all.
// An inline <svg> is markup, not a script or a fetch: it renders under it.
var pageCSP = func() string {
	sum := sha256.Sum256([]byte(pageCSS))
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; " +
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
}()

func (p *Page) render(w http.ResponseWriter, status int, v *view) {
	v.Actions = p.Token != ""
	v.CSS = template.CSS(pageCSS)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Header().Set("Content-Security-Policy", pageCSP)
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

func groupQuery(queue, class, fingerprint string) url.Values {
	return url.Values{"queue": {queue}, "class": {class}, "fingerprint": {fingerprint}}
}

// stats is the overview: the groups the URL's filter selects, sorted as
// it asks, with their totals and arrival timelines.
func (p *Page) stats(w http.ResponseWriter, r *http.Request) {
	o, err := parseOverview(r.URL.Query(), p.clock())
	if err != nil {
		p.fail(w, http.StatusBadRequest, err)
		return
	}
	// The filter form sends its empty fields too: the page answers with
	// the same view under its shortest URL, the one worth pasting.
	if r.URL.RawQuery != o.Values().Encode() {
		http.Redirect(w, r, o.Link(), http.StatusSeeOther)
		return
	}
	snap, err := p.shared(r.Context())
	if err != nil {
		p.fail(w, http.StatusBadGateway, err)
		return
	}
	// A window of the last hour ends at the read, not at the request.
	o, _ = parseOverview(r.URL.Query(), snap.At)
	v := &view{Title: "Quarantine", Snapshot: snap, Query: o, Refresh: o.Refresh, Choices: choicesOf(p.Config, snap)}
	v.Groups, v.Totals, v.Window = overviewOf(snap, o)
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

// group is one group's page: its records (open first, the first
// pageRecords), its timeline, and the replay and purge of some or all.
func (p *Page) group(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	queue, class, fp := q.Get("queue"), q.Get("class"), q.Get("fingerprint")
	if queue == "" {
		p.fail(w, http.StatusBadRequest, errors.New("a group needs its queue (the queue parameter)"))
		return
	}
	snap, err := p.shared(r.Context())
	if err != nil {
		p.fail(w, http.StatusBadGateway, err)
		return
	}
	var row *groupRow
	recs := inGroup(snap, queue, class, fp, allStates...)
	for _, g := range snap.Stats(quarantine.Filter{Queue: queue, Class: class, Fingerprint: fp}) {
		if g.Queue == queue && g.Class == class && g.Fingerprint == fp {
			row = &groupRow{Group: g, Query: groupQuery(queue, class, fp),
				Envelopes: countVerdicts(&quarantine.Snapshot{Records: recs})[[3]string{queue, class, fp}]}
		}
	}
	if row == nil {
		p.fail(w, http.StatusNotFound, fmt.Errorf("no records in queue %q, class %q, fingerprint %q", queue, class, fp))
		return
	}
	row.Timeline = groupTimeline(row.Group, recs, snap.At)
	v := &view{Title: "Group " + shorten(row.Example, 60), Snapshot: snap, Group: row, Total: len(recs), Back: backLink(q.Get("back"), snap.At),
		Result: &actionView{Sel: selection{Queue: queue, Class: class, Fingerprint: fp, Max: PageDefaultMax, Rate: PageDefaultRate}}}
	rows := recordRows(recs, snap.At)
	if len(rows) > pageRecords {
		rows = rows[:pageRecords]
	}
	v.Rows, v.Shown = rows, len(rows)
	p.render(w, http.StatusOK, v)
}

// backLink is the overview a group page came from (its query, checked
// and written again: only the overview's own settings pass).
func backLink(back string, now time.Time) string {
	if back == "" {
		return "/quarantine"
	}
	q, err := url.ParseQuery(back)
	if err != nil {
		return "/quarantine"
	}
	o, err := parseOverview(q, now)
	if err != nil {
		return "/quarantine"
	}
	return o.Link()
}

// record is one record's page: its envelope, headers, payload (JSON
// indented unless ?raw=1), its other trips through the quarantine, and
// the actions on it alone. Its payload is the only one the page reads.
func (p *Page) record(w http.ResponseWriter, r *http.Request) {
	snap, err := p.shared(r.Context())
	if err != nil {
		p.fail(w, http.StatusBadGateway, err)
		return
	}
	rec, err := snap.Get(r.PathValue("id"))
	if err != nil {
		p.fail(w, http.StatusNotFound, err)
		return
	}
	full, err := p.body(r.Context(), rec)
	if errors.Is(err, errBusy) {
		busy(w)
		return
	}
	if err != nil {
		p.fail(w, http.StatusBadGateway, err)
		return
	}
	g := groupQuery(rec.Queue, string(rec.Envelope.Class), rec.Envelope.Fingerprint)
	rv := &recordView{R: rec, Owner: strings.TrimSpace(rec.Owner.Team + " " + rec.Owner.Contact), Size: len(full),
		Age: compact(snap.At.Sub(rec.Seen())), History: historyRows(rec, snap.History(rec)), Raw: r.URL.Query().Get("raw") == "1",
		GroupLink: "/quarantine/group?" + g.Encode(), Replayable: rec.State == quarantine.StateOpen,
		Purgeable: rec.State == quarantine.StateOpen || rec.State == quarantine.StateExpired,
		Sel: selection{Queue: rec.Queue, Class: string(rec.Envelope.Class), Fingerprint: rec.Envelope.Fingerprint,
			Picked: []string{rec.ID}, Max: PageDefaultMax, Rate: PageDefaultRate}}
	h := rec.Headers()
	for k, val := range h {
		rv.Headers = append(rv.Headers, headerRow{k, fmt.Sprintf("%v", val)})
	}
	sort.Slice(rv.Headers, func(i, j int) bool { return rv.Headers[i].Key < rv.Headers[j].Key })
	body := full
	if len(body) > pagePayload {
		// A copy, so that the rest of a large payload is not kept while
		// the page renders.
		body, rv.Truncated = bytes.Clone(body[:pagePayload]), true
		// Cut back to a whole rune.
		for i := 0; i < utf8.UTFMax && len(body) > 0 && !utf8.Valid(body); i++ {
			body = body[:len(body)-1]
		}
	}
	switch {
	case !payload.IsText(body):
		rv.Payload, rv.Base64 = base64.StdEncoding.EncodeToString(body), true
	default:
		rv.Payload = string(body)
		if !rv.Truncated {
			if pretty, ok := prettyJSON(body); ok {
				rv.CanPretty = true
				if !rv.Raw {
					rv.Payload, rv.Pretty = pretty, true
				}
			}
		}
	}
	p.render(w, http.StatusOK, &view{Title: "Record " + rec.ID, Snapshot: snap, Record: rv})
}

// audit is the audit trail: the quarantines' events, newest first, a page
// at a time.
func (p *Page) audit(w http.ResponseWriter, r *http.Request) {
	a, err := parseAudit(r.URL.Query(), p.Config)
	if err != nil {
		p.fail(w, http.StatusBadRequest, err)
		return
	}
	snap, err := p.shared(r.Context())
	if err != nil {
		p.fail(w, http.StatusBadGateway, err)
		return
	}
	av := &auditView{Q: a, Kinds: eventKinds, From: a.Offset + 1}
	for i := range p.Config.Queues {
		av.Queues = append(av.Queues, p.Config.Queues[i].Name)
	}
	av.Rows, av.Matched = auditOf(snap, p.Config, a)
	page := func(off int) string {
		v := a.values()
		if off > 0 {
			v.Set("offset", strconv.Itoa(off))
		}
		if e := v.Encode(); e != "" {
			return "/quarantine/audit?" + e
		}
		return "/quarantine/audit"
	}
	if a.Offset+len(av.Rows) < av.Matched {
		av.Older = page(a.Offset + auditPage)
	}
	if a.Offset > 0 {
		av.Newer = page(max(0, a.Offset-auditPage))
	}
	p.render(w, http.StatusOK, &view{Title: "Audit trail", Snapshot: snap, Audit: av})
}

// checkToken says why the request's token does not let it act, or nil
// when it does: the digests of the given and the configured token are
// compared in constant time. Each refusal says exactly what is wrong, so
// an operator who mistyped the token is not told the page is read-only.
func (p *Page) checkToken(r *http.Request) error {
	if p.Token == "" {
		return ErrReadOnly
	}
	got := r.Header.Get(TokenHeader)
	if got == "" {
		got = r.PostFormValue("token")
	}
	if got == "" {
		return ErrNoToken
	}
	if !tokenMatches(got, p.Token) {
		return ErrWrongToken
	}
	return nil
}

// tooManyGuesses answers 429 and reports true when client has used up its
// tries at the operator token (see failLimiter).
func (p *Page) tooManyGuesses(w http.ResponseWriter, client string, now time.Time) bool {
	ok, wait := p.fails.allow(client, now)
	if ok {
		return false
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
	p.fail(w, http.StatusTooManyRequests, fmt.Errorf("too many refused operator tokens from %s: try again in %s", client, (wait+time.Second).Round(time.Second)))
	return true
}

// guessed takes a try from client for a request refused with err: a wrong
// token or confirmation is a guess; a request without a token, or to a
// page without one, guesses nothing. The WARN lines are rate-limited.
func (p *Page) guessed(r *http.Request, client string, now time.Time, err error) {
	if err != ErrWrongToken && err != ErrConfirmation {
		return
	}
	if logNow, unlogged := p.fails.failed(client, now); logNow {
		p.log().Warn("quarantine page: refused an operator token", "path", r.URL.Path, "remote", r.RemoteAddr, "why", err.Error(), "refusals_unlogged", unlogged)
	}
}

// The refusals of a replay or purge.
var (
	// ErrConfirmation: a confirmation that is unknown, used, expired or for
	// the other action.
	ErrConfirmation = errors.New("forbidden: this confirmation is unknown, already used, expired or for another action: run the dry run again")
	// ErrReadOnly: this page has no operator token, so nobody may act.
	ErrReadOnly = errors.New("forbidden: this page is read-only: no operator token is configured (run.operator_token_env), so it cannot replay or purge; the CLI can")
	// ErrNoToken: a token is configured and the request gave none.
	ErrNoToken = errors.New("forbidden: no operator token given: type it into the form's operator token field (a client without the form sends the X-Dlxbridge-Token header)")
	// ErrWrongToken: the request's token is not the configured one.
	ErrWrongToken = errors.New("forbidden: wrong operator token: it is not the one this sidecar was started with (the value of the variable run.operator_token_env names)")
)

// act is POST /quarantine/replay and /quarantine/purge. Without "confirm"
// it is a dry run that lists exactly what would move: the group's
// records, or only the ones ticked (the "id" fields) of it; the confirm
// form carries the dry run's confirmation, bound to those records, and
// only they move.
func (p *Page) act(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm) // read by limited, when mounted
	kind := strings.TrimPrefix(r.URL.Path, "/quarantine/")
	client, now := clientKey(r.RemoteAddr), p.clock()
	if p.Token != "" && p.tooManyGuesses(w, client, now) {
		return
	}
	// A confirmation from the page's dry run stands for the token, and
	// brings the dry run's selection and records with it.
	var confirmed *pending
	confirmation := r.PostFormValue("confirmation")
	if confirmation != "" && p.Token != "" {
		if pd, ok := p.confirms.take(confirmation, kind, now); ok {
			confirmed = pd
		}
	}
	if confirmed == nil {
		if err := p.checkToken(r); err != nil {
			if confirmation != "" && p.Token != "" {
				err = ErrConfirmation
			}
			p.guessed(r, client, now, err)
			p.fail(w, http.StatusForbidden, err)
			return
		}
	}
	// A replay runs at its rate for as long as its records take: the
	// operator's request is not cut by the server's write timeout.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
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
	var snap *quarantine.Snapshot // the page's, for the plan's verdicts
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
		snap, err = p.shared(r.Context())
		if err != nil {
			p.fail(w, http.StatusBadGateway, err)
			return
		}
		inSel := map[string]bool{}
		for _, id := range sel.Picked {
			inSel[id] = true
		}
		for _, rec := range inGroup(snap, sel.Queue, sel.Class, sel.Fingerprint, filter.States...) {
			if len(sel.Picked) == 0 || inSel[rec.ID] {
				filter.IDs = append(filter.IDs, rec.ID)
				delete(inSel, rec.ID)
			}
		}
		for _, id := range sel.Picked {
			if inSel[id] {
				av.Dropped = append(av.Dropped, id)
			}
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
	rp := &quarantine.Replayer{Conn: conn, Config: p.Config, Registry: p.Registry, By: by, LockWait: lockWait, Signer: p.Signer}
	if kind == "replay" && snap == nil {
		// For the plan's verdicts (without it, the plan shows none); read
		// before the replay, which drops the shared snapshot.
		snap, _ = p.shared(r.Context())
	}
	if confirm {
		// Whatever the outcome, the shared snapshot may be out of date.
		defer p.changed()
	}
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
		opts := quarantine.ReplayOptions{Filter: filter, DryRun: !confirm, Max: sel.Max,
			Rate: sel.Rate, Reason: reason, SkipInvalid: sel.SkipInvalid}
		var res *quarantine.ReplayResult
		if confirm {
			res, av.Running, err = p.replayDetached(lockWait, by, opts)
		} else {
			res, err = rp.Replay(r.Context(), opts)
		}
		if res == nil {
			p.fail(w, http.StatusConflict, err)
			return
		}
		if err != nil {
			av.ConfirmNote = err.Error()
			status = http.StatusConflict
		}
		av.Selected, av.Sent, av.Invalid, av.OverBudget, av.Stopped, av.Run =
			res.Selected, res.Sent, res.Invalid, res.OverBudget, res.Stopped, res.Run
		var ids []string
		for _, pl := range res.Plan {
			row := planRow{Planned: pl}
			if snap != nil {
				if rec, err := snap.Get(pl.ID); err == nil {
					v := envelopeVerdict(rec.Envelope)
					row.Verdict = &v
				}
			}
			av.Plan = append(av.Plan, row)
			if pl.Refused == "" {
				ids = append(ids, pl.ID)
				if row.Verdict != nil && row.Verdict.Mark != "" {
					av.Unverified++
				}
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
	seen := map[string]bool{}
	for _, id := range r.PostForm["id"] {
		if id = strings.TrimSpace(id); id != "" && !seen[id] {
			seen[id] = true
			s.Picked = append(s.Picked, id)
		}
	}
	if len(s.Picked) > pickedMax {
		return s, fmt.Errorf("id: %d records ticked; at most %d at once (or choose every record of the group)", len(s.Picked), pickedMax)
	}
	switch scope := r.PostFormValue("scope"); scope {
	case "":
	case "group":
		s.Picked = nil
	case "picked":
		if len(s.Picked) == 0 {
			return s, errors.New("no records ticked: tick the records to act on, or choose every record of the group")
		}
	default:
		return s, fmt.Errorf("scope: %q is not picked or group", scope)
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
