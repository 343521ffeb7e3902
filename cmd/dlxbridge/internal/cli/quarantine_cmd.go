package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/frame"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/triage"
	"github.com/dlxbridge/dlxbridge/wire"
)

// runQuarantine: dlxbridge quarantine list|show|stats|replay|purge|audit|export.
//
// list, show, stats and audit only read (the records and events streams,
// by offset): they change nothing on the broker. Exit 1: the broker could
// not be reached, no record has the id, or a replay or purge was refused
// (invalid payloads, a lock held elsewhere) or failed midway. Exit 2: bad
// usage or config, or a replay or purge without a selector.
func runQuarantine(ctx context.Context, env *Env, args []string) int {
	sub, rest, code, ok := subcommand(env, "quarantine", args,
		subcmd{"list", "list records, filtered; changes nothing"},
		subcmd{"show", "one record's envelope and payload"},
		subcmd{"stats", "records grouped by queue, class and fingerprint, with ages and owners"},
		subcmd{"replay", "send selected records back through the normal path: filtered, paced, audited"},
		subcmd{"purge", "mark selected records resolved without sending them (--reason required)"},
		subcmd{"audit", "who replayed or purged what, when and why"},
		subcmd{"export", "write selected records to an archive directory (JSON lines and a manifest of digests); changes nothing"},
		subcmd{"jobs", "replays as jobs: state, counts, each message's outcome; jobs cancel ID stops one"})
	if !ok {
		return code
	}
	if sub == "jobs" {
		return runJobs(ctx, env, rest)
	}
	usage := map[string]string{
		"list":   "quarantine list [filters] [--state open|replayed|purged|expired|all] [--limit N]",
		"show":   "quarantine show ID",
		"stats":  "quarantine stats [filters] [--state ...]",
		"replay": "quarantine replay FILTERS [--from-archive DIR] [--to-queue Q] [--dry-run] [--max N] [--rate R] [--reason TEXT] [--skip-invalid] [--patch FILE | --replace-body FILE] [--set-header NAME=VALUE] [--set-type T] [--set-version V] [--lock-wait 10s]",
		"purge":  "quarantine purge FILTERS --reason TEXT [--dry-run] [--max N]",
		"audit":  "quarantine audit [--all]",
		"export": "quarantine export --to DIR [filters] [--state ...]",
	}[sub]
	fs := newFlagSet(env, "quarantine "+sub, usage+" [--config config.yaml] [--url amqp://...] [--output text|json]")
	if sub == "list" {
		flags := fs.Usage
		fs.Usage = func() { flags(); fmt.Fprint(fs.Output(), listColumns) }
	}
	var c common
	c.register(fs, env)
	var f filterFlags
	if sub != "show" && sub != "audit" {
		f.register(fs, sub == "list" || sub == "stats" || sub == "export")
	}
	// Each subcommand registers only its own flags, so -h lists what it takes.
	limit, all, wide, raw := new(int), new(bool), new(bool), new(bool)
	if sub == "list" || sub == "stats" || sub == "audit" {
		fs.BoolVar(wide, "wide", false, fmt.Sprintf("show every column, uncut (by default the table fits %d columns)", tableWidth))
	}
	if sub == "show" {
		fs.BoolVar(raw, "raw", false, "print the payload as stored (by default a JSON payload is indented)")
	}
	if sub == "list" {
		fs.IntVar(limit, "limit", 50, "show at most N records (0: all)")
	}
	var ro replayFlags
	if sub == "replay" || sub == "purge" {
		ro.register(fs, sub)
	}
	if sub == "audit" {
		fs.BoolVar(all, "all", false, "include the per-record replayed events")
	}
	exportTo := new(string)
	if sub == "export" {
		fs.StringVar(exportTo, "to", "", "the archive directory (required; created if missing, refused unless empty)")
	}
	var id string
	if sub == "show" && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		id, rest = rest[0], rest[1:] // show ID [flags]
	}
	if code, ok := parseFlags(env, fs, rest); !ok {
		return code
	}
	switch {
	case sub == "show" && id == "" && fs.NArg() == 1:
		id = fs.Arg(0)
	case sub == "show" && (id == "" || fs.NArg() > 0):
		fmt.Fprintln(env.Stderr, "usage: dlxbridge "+usage)
		return ExitUsage
	case fs.NArg() > 0:
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine %s: unexpected argument %q\n", sub, fs.Arg(0))
		return ExitUsage
	}
	if !c.checkOutput(env) {
		return ExitUsage
	}
	// A negative --max would mean no cap, a negative or non-finite --rate
	// no pacing: the opposite of what was asked for.
	if ro.max < 0 || ro.rate < 0 || math.IsNaN(ro.rate) || math.IsInf(ro.rate, 0) {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine %s: --max and --rate must be 0 or more (0: no cap, unpaced)\n", sub)
		return ExitUsage
	}
	filter, err := f.filter(time.Now())
	if err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine %s: %v\n", sub, err)
		return ExitUsage
	}
	cfg, ok := loadConfig(env, c.configPath)
	if !ok {
		return ExitUsage
	}
	if !checkSelectors(env, sub, filter, cfg) {
		return ExitUsage
	}
	// A key that is set but unusable is a setup mistake: say so before
	// connecting, with the exit code of a bad config.
	if _, err := envSigner(env.Getenv, cfg); err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine %s: %v\n", sub, err)
		return ExitUsage
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine %s: %s\n", sub, fmt.Sprintf(format, a...))
		return ExitFail
	}
	if (sub == "replay" || sub == "purge") && !filter.HasSelector() {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine %s: %v\n", sub, quarantine.ErrNoSelector)
		return ExitUsage
	}
	if sub == "export" && *exportTo == "" {
		fmt.Fprintln(env.Stderr, "dlxbridge quarantine export: --to DIR is required")
		return ExitUsage
	}
	if ro.fromArchive != "" {
		// A path that names no directory is a mistyped flag, not an
		// archive that fails its manifest: said before connecting.
		if st, err := os.Stat(ro.fromArchive); err != nil || !st.IsDir() {
			fmt.Fprintf(env.Stderr, "dlxbridge quarantine %s: --from-archive %s: no such archive directory (quarantine export --to writes one)\n", sub, ro.fromArchive)
			return ExitUsage
		}
	}
	if sub == "purge" && strings.TrimSpace(ro.reason) == "" {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine purge: %v (--reason)\n", quarantine.ErrNoReason)
		return ExitUsage
	}
	url, ok := c.checkedURL(env, "quarantine "+sub)
	if !ok {
		return ExitUsage
	}
	conn, err := dial(ctx, env, url, cfg.Broker.ConnectionName+"/quarantine-"+sub)
	if err != nil {
		return fail("%v", err)
	}
	defer conn.Close()

	switch sub {
	case "replay", "purge":
		return runRedrive(ctx, env, sub, &c, &ro, cfg, filter, conn, fail)
	}
	// With the key, an event that no valid signature vouches for changes
	// nothing once its stream holds a signed one (audit marks it);
	// without, every event counts and none is verified.
	verifier, err := envSigner(env.Getenv, cfg)
	if err != nil {
		return fail("%v", err)
	}
	in := &quarantine.Inspector{Conn: conn, Config: cfg, Verifier: verifier}
	if sub == "export" {
		m, err := in.Export(ctx, quarantine.ExportOptions{Dir: *exportTo, Filter: filter, Vhost: vhostOf(url)})
		if err != nil {
			return fail("%v", err)
		}
		return renderOr(env, c.output, fail, m, func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "exported %d record(s) to %s (sha256 %s)\n", m.Count, *exportTo, m.SHA256)
			return err
		})
	}
	snap, err := in.Snapshot(ctx)
	if err != nil {
		return fail("%v", err)
	}
	switch sub {
	case "list":
		recs := snap.List(filter)
		total := len(recs)
		if *limit > 0 && len(recs) > *limit {
			recs = recs[:*limit]
		}
		return renderOr(env, c.output, fail, map[string]any{"total": total, "records": nonNil(recs)}, func(w io.Writer) error {
			if err := writeList(w, recs, total, snap.At, *wide); err != nil {
				return err
			}
			return writeIntakeWaiting(w, snap)
		})
	case "show":
		r, err := snap.Get(id)
		if err != nil {
			return fail("%v", err)
		}
		hist := snap.History(r)
		return renderOr(env, c.output, fail, map[string]any{"record": r, "history": nonNil(hist)}, func(w io.Writer) error {
			return writeRecord(w, r, hist, snap.At, *raw)
		})
	case "stats":
		groups := snap.Stats(filter)
		return renderOr(env, c.output, fail, map[string]any{"groups": groups, "intake_waiting": snap.Intake, "undecodable": snap.Undecodable}, func(w io.Writer) error {
			return writeStats(w, groups, snap, *wide)
		})
	default: // audit
		var events []quarantine.Event
		for _, e := range snap.Events {
			if *all || e.Kind != quarantine.EventReplayed {
				events = append(events, e)
			}
		}
		return renderOr(env, c.output, fail, map[string]any{"events": nonNil(events)}, func(w io.Writer) error {
			return writeAudit(w, events, *wide, verifier != nil, cfg.Security.SigningKeyEnv)
		})
	}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func renderOr(env *Env, output string, fail func(string, ...any) int, v any, text func(io.Writer) error) int {
	if err := render(env.Stdout, output, v, text); err != nil {
		return fail("%v", err)
	}
	return ExitOK
}

// filterFlags are the selectors shared by list, stats, replay and purge.
type filterFlags struct {
	ids, queue, class, reason, fingerprint, typ, version, since, until, errText, state string
}

func (f *filterFlags) register(fs *flag.FlagSet, states bool) {
	fs.StringVar(&f.ids, "id", "", "record ids (or unique prefixes of at least 4), comma-separated")
	fs.StringVar(&f.queue, "queue", "", "work queue (or quarantine queue)")
	fs.StringVar(&f.class, "class", "", "failure class: "+classNames())
	fs.StringVar(&f.reason, "reason-contains", "", "text in the quarantine reason")
	fs.StringVar(&f.fingerprint, "fingerprint", "", "failure fingerprint (or a prefix)")
	fs.StringVar(&f.typ, "type", "", "message type")
	fs.StringVar(&f.version, "version", "", "schema version")
	fs.StringVar(&f.since, "since", "", "quarantined at or after: RFC 3339 time, or a duration ago (e.g. 2h)")
	fs.StringVar(&f.until, "until", "", "quarantined before: RFC 3339 time, or a duration ago")
	fs.StringVar(&f.errText, "error", "", "text in the error")
	if states {
		fs.StringVar(&f.state, "state", "open", "open, replayed, purged, expired, comma-separated, or all (stats: all unless given)")
	}
}

func (f *filterFlags) filter(now time.Time) (quarantine.Filter, error) {
	q := quarantine.Filter{Queue: f.queue, Class: f.class, Reason: f.reason, Fingerprint: f.fingerprint,
		Type: f.typ, Version: f.version, Error: f.errText}
	for _, id := range strings.Split(f.ids, ",") {
		if id = strings.TrimSpace(id); id != "" {
			q.IDs = append(q.IDs, id)
		}
	}
	var err error
	if q.Since, err = parseWhen(f.since, now); err != nil {
		return q, fmt.Errorf("--since: %w", err)
	}
	if q.Until, err = parseWhen(f.until, now); err != nil {
		return q, fmt.Errorf("--until: %w", err)
	}
	switch f.state {
	case "", "open":
	case "all":
		q.States = []quarantine.State{quarantine.StateOpen, quarantine.StateReplayed, quarantine.StatePurged, quarantine.StateExpired}
	default:
		for _, s := range strings.Split(f.state, ",") {
			st := quarantine.State(strings.TrimSpace(s))
			switch st {
			case quarantine.StateOpen, quarantine.StateReplayed, quarantine.StatePurged, quarantine.StateExpired:
				q.States = append(q.States, st)
			default:
				return q, fmt.Errorf("--state: %q is not open, replayed, purged, expired or all", s)
			}
		}
	}
	return q, nil
}

// classNames lists the failure classes, for --class's help and errors.
func classNames() string {
	names := make([]string, 0, len(triage.Classes()))
	for _, c := range triage.Classes() {
		names = append(names, string(c))
	}
	return strings.Join(names, ", ")
}

// checkSelectors catches a typo before it selects nothing in silence: a
// --class that is no class is refused (false); a --queue that the config
// does not name is only warned about, since records of a queue since
// removed from the config may still be in the stream.
func checkSelectors(env *Env, sub string, f quarantine.Filter, cfg *config.Config) bool {
	if f.Class != "" && !slices.Contains(triage.Classes(), triage.Class(f.Class)) {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine %s: --class %q is not a failure class (%s)\n", sub, f.Class, classNames())
		return false
	}
	if f.Queue == "" {
		return true
	}
	var names []string
	for _, q := range cfg.Queues {
		if f.Queue == q.Name || f.Queue == q.Quarantine.Queue {
			return true
		}
		names = append(names, q.Name)
	}
	fmt.Fprintf(env.Stderr, "dlxbridge quarantine %s: warning: --queue %q is none of the config's queues (%s) nor their quarantine queues: nothing matches unless the stream holds records of a queue since removed from it\n",
		sub, f.Queue, strings.Join(names, ", "))
	return true
}

func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration", s)
	}
	return t, nil
}

// replayFlags are replay's and purge's own flags.
type replayFlags struct {
	toQueue, reason, patch, replace string
	// fromArchive is an archive directory that quarantine export wrote.
	fromArchive string
	// setHeaders, typ and version repair a message's identity (see
	// quarantine.Patch): the commonest producer bug is a missing or wrong
	// schema-version header, which no body patch can fix.
	setHeaders          map[string]string
	typ, version        string
	dryRun, skipInvalid bool
	max                 int
	rate                float64
	lockWait            time.Duration
}

func (r *replayFlags) register(fs *flag.FlagSet, sub string) {
	fs.BoolVar(&r.dryRun, "dry-run", false, "show exactly what would move; change nothing")
	fs.IntVar(&r.max, "max", 0, "at most N records (0: no cap)")
	fs.DurationVar(&r.lockWait, "lock-wait", 10*time.Second, "wait this long for another replay or purge of the same quarantine")
	if sub == "purge" {
		fs.StringVar(&r.reason, "reason", "", "why (required; recorded in the audit trail)")
		return
	}
	fs.StringVar(&r.reason, "reason", "", "why (recorded in each message and the audit trail)")
	fs.StringVar(&r.fromArchive, "from-archive", "", "replay the records of this archive (quarantine export --to) instead of the stream's; every digest is checked first")
	fs.StringVar(&r.toQueue, "to-queue", "", "send to this queue instead of each record's own work queue")
	fs.Float64Var(&r.rate, "rate", 0, "messages per second (0: unpaced)")
	fs.BoolVar(&r.skipInvalid, "skip-invalid", false, "leave out messages that fail the current schema instead of refusing")
	fs.StringVar(&r.patch, "patch", "", "JSON merge patch FILE applied to each payload (the result must pass the schema)")
	fs.StringVar(&r.replace, "replace-body", "", "FILE replacing each payload (it must pass the schema)")
	fs.Func("set-header", "set header NAME=VALUE on each message (repeatable; not x-…, CC, BCC or dlxbridge-…; the result must pass the schema)", func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return errors.New("want NAME=VALUE")
		}
		if r.setHeaders == nil {
			r.setHeaders = map[string]string{}
		}
		if _, dup := r.setHeaders[k]; dup {
			return fmt.Errorf("header %q set twice", k)
		}
		r.setHeaders[k] = val
		return nil
	})
	fs.StringVar(&r.typ, "set-type", "", "set the AMQP type property of each message (--type filters)")
	fs.StringVar(&r.version, "set-version", "", "set the schema version header of each message (the queue's message.version_header; --version filters)")
}

func runRedrive(ctx context.Context, env *Env, sub string, c *common, ro *replayFlags, cfg *config.Config,
	filter quarantine.Filter, conn *amqp.Connection, fail func(string, ...any) int) int {
	rp := &quarantine.Replayer{Conn: conn, Config: cfg, LockWait: ro.lockWait}
	// With the consumers' key (security.signing_key_env) a replayed message
	// keeps an origin the runtime trusts; without it the origin is where
	// the replay sends it.
	signer, err := envSigner(env.Getenv, cfg)
	if err != nil {
		return fail("%v", err)
	}
	rp.Signer = signer
	if signer == nil && sub == "replay" && !ro.dryRun {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine replay: $%s is unset: the runtime cannot verify the origin (exchange, routing key) the replayed messages carry. "+
			"One that fails again is recorded with where the replay sent it, and the origin it claimed in an \"origin not verified\" note. "+
			"Nor can it verify their redrive count: one that fails again is recorded with no prior replays, so max_redrives counts afresh, "+
			"and this replay counts prior replays as the records claim them. "+
			"Set the consumers' signing key to keep both.\n", cfg.Security.SigningKeyEnv)
	}
	if signer == nil && !ro.dryRun {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine %s: $%s is unset, so the events this %s writes are unsigned: "+
			"once a quarantine's events are signed (a runtime with the key marks that at start), every reader with the key ignores them, "+
			"and the records this %s resolves still look open there.\n", sub, cfg.Security.SigningKeyEnv, sub, sub)
	}
	if sub == "purge" {
		res, err := rp.Purge(ctx, quarantine.PurgeOptions{Filter: filter, Reason: ro.reason, DryRun: ro.dryRun, Max: ro.max})
		if err != nil {
			return fail("%v", err)
		}
		return renderOr(env, c.output, fail, res, func(w io.Writer) error {
			verb := "purged"
			if res.DryRun {
				verb = "would purge"
			}
			_, err := fmt.Fprintf(w, "%s %d of %d selected record(s) (run %s): %s\n", verb, len(res.Purged), res.Selected, res.Run, strings.Join(res.Purged, " "))
			return err
		})
	}
	registry, err := schemas.Load(schemas.LoadOptions{Dir: cfg.Schemas.Dir})
	if err != nil {
		return fail("schema registry: %v", err)
	}
	rp.Registry = registry
	opts := quarantine.ReplayOptions{Filter: filter, ToQueue: ro.toQueue, DryRun: ro.dryRun, Max: ro.max, Rate: ro.rate,
		Reason: ro.reason, SkipInvalid: ro.skipInvalid}
	if ro.fromArchive != "" {
		// Checked before anything is locked or sent: one line that does
		// not match its digest refuses the whole archive.
		a, err := (&quarantine.Inspector{Config: cfg}).ReadArchive(ro.fromArchive)
		if err != nil {
			return fail("%v", err)
		}
		opts.Archive = a
	}
	if ro.reason == "" {
		opts.Reason = "replayed with dlxbridge quarantine replay"
	}
	switch {
	case ro.patch != "" && ro.replace != "":
		fmt.Fprintln(env.Stderr, "dlxbridge quarantine replay: --patch and --replace-body exclude each other")
		return ExitUsage
	case ro.patch != "":
		b, err := os.ReadFile(ro.patch)
		if err != nil {
			return fail("%v", err)
		}
		if !json.Valid(b) {
			return fail("--patch %s: not JSON", ro.patch)
		}
		opts.Patch = &quarantine.Patch{Merge: b}
	case ro.replace != "":
		b, err := os.ReadFile(ro.replace)
		if err != nil {
			return fail("%v", err)
		}
		opts.Patch = &quarantine.Patch{Replace: b}
	}
	if len(ro.setHeaders) > 0 || ro.typ != "" || ro.version != "" {
		if opts.Patch == nil {
			opts.Patch = &quarantine.Patch{}
		}
		opts.Patch.Headers, opts.Patch.Type = ro.setHeaders, ro.typ
		opts.Patch.Version = ro.version
		if err := opts.Patch.Check(); err != nil {
			fmt.Fprintf(env.Stderr, "dlxbridge quarantine replay: %v\n", err)
			return ExitUsage
		}
	}
	if isTerminal(env.Stderr) {
		opts.Progress = func(p quarantine.Progress) {
			fmt.Fprintf(env.Stderr, "\r%d/%d sent  %.1f/s  ETA %s   ", p.Done, p.Total, p.Rate, p.ETA.Round(time.Second))
		}
	}
	res, err := rp.Replay(ctx, opts)
	if opts.Progress != nil {
		fmt.Fprintln(env.Stderr)
	}
	if res != nil {
		if rerr := render(env.Stdout, c.output, res, func(w io.Writer) error { return writeReplay(w, res) }); rerr != nil {
			return fail("%v", rerr)
		}
	}
	if err != nil {
		return fail("%v", err)
	}
	if res.Stopped {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine replay: %s; the rest stay open\n", res.Stop)
		return ExitFail
	}
	return ExitOK
}

// vhostOf is the virtual host url names (every node's is the same), for
// an archive's manifest.
func vhostOf(url string) string {
	eps, err := amqpx.ParseURLList(url)
	if err != nil || len(eps) == 0 {
		return ""
	}
	return eps[0].Vhost
}

func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Round(time.Second).String()
}

// listColumns says what each column of list's text output holds (its JSON
// holds the records, under their own field names).
const listColumns = `
columns:
  ID             the record's id (for show, --id)
  QUEUE          the work queue the message failed on
  CLASS, FINGERPRINT, REASON
                 from the failure envelope. A "?" after the class: the envelope
                 claims the bridge wrote it, and no valid envelope signature
                 was checked (a record stored before envelopes were signed, or
                 by a keeper without the consumers' key): its fields are the
                 message's word. "(unverified)": an envelope whose signature
                 did not verify, on a message without x-death (see show's notes)
  AGE            since the message was quarantined
  STATE          open, or what became of this record: replayed, purged, expired
                 (left out when every record listed is open). A "?" after
                 replayed or purged: no valid signature was checked on the
                 event that says so (read without the signing key, or an event
                 from before its stream's events were signed; see audit)
  MESSAGE ID     the message's message-id property
  ERROR          what went wrong: the handler's or the gate's error, cut to fit
                 100 columns (--wide: every column, uncut; REASON, FINGERPRINT
                 and PRIOR_REPLAYS appear only there)
  PRIOR_REPLAYS  how many times the message had been replayed out of the
                 quarantine before it came into the quarantine this time (its
                 dlxbridge-redrive-count header, if the replay's signature or
                 the runtime's envelope signature vouches for it, else 0 and
                 a note keeps the claim; JSON: redrive_count). Replaying
                 this record does not change it (STATE does): if the message fails
                 again, its new record says one more. replay refuses a message
                 whose count reached the queue's quarantine.max_redrives.
`

func writeList(w io.Writer, recs []*quarantine.Record, total int, now time.Time, wide bool) error {
	t := &table{wide: wide, cols: []column{
		{name: "ID", max: 12}, {name: "QUEUE", max: 12, keepEnd: true}, {name: "CLASS", max: 11}, {name: "FINGERPRINT", wideOnly: true, max: 16},
		{name: "AGE", max: 8}, {name: "STATE", max: 8, hideIf: string(quarantine.StateOpen)}, {name: "PRIOR_REPLAYS", wideOnly: true, max: 2},
		{name: "MESSAGE ID", max: 16}, {name: "REASON", wideOnly: true, max: 40}, {name: "ERROR", min: 20},
	}}
	for _, r := range recs {
		t.add(r.ID, printable(r.Queue, ""), listClass(r.Envelope), printable(r.Envelope.Fingerprint, ""),
			age(now, r.Seen()), listState(r), fmt.Sprint(r.Redrives), printable(r.Properties.MessageID, ""),
			printable(frame.Truncate(r.Envelope.Reason, 80), ""), printable(frame.Truncate(errorText(r.Envelope), 200), ""))
	}
	if err := t.write(w); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "%d of %d record(s)\n", len(recs), total); err != nil {
		return err
	}
	// jobs explains its "?" under the table; list does the same, since an
	// operator without the signing key sees it on every record.
	for _, r := range recs {
		if strings.HasSuffix(listClass(r.Envelope), "?") || strings.HasSuffix(listState(r), "?") {
			_, err := io.WriteString(w, wrap("?: a class or state marked so was not verified by a signature (read without the signing key, or stored before signing began): it is the record's word; list -h says more", tableWidth))
			return err
		}
	}
	return nil
}

// errorText is what went wrong, for people: the error, else the reason.
func errorText(e quarantine.Envelope) string {
	if e.Error != "" {
		return e.Error
	}
	return e.Reason
}

// writeIntakeWaiting says which intakes hold messages the keeper has not
// stored yet: list and stats show records only, and a message waits there
// (unredacted) while no runtime keeps the quarantine.
func writeIntakeWaiting(w io.Writer, snap *quarantine.Snapshot) error {
	for _, intake := range sortedIntakes(snap.Intake) {
		if n := snap.Intake[intake]; n > 0 {
			if _, err := fmt.Fprintf(w, "intake %s: %d message(s) not yet stored (is the runtime running?)\n", intake, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// violationText is one schema violation as `schemas validate` prints it:
// the document itself is "(root)", not a gap before the keyword.
func violationText(v quarantine.Violation) string {
	p := v.Pointer
	if p == "" {
		p = "(root)"
	}
	return p + " " + v.Keyword + ": " + v.Message
}

func writeRecord(w io.Writer, r *quarantine.Record, hist []*quarantine.Record, now time.Time, raw bool) error {
	e := r.Envelope
	tw := &kvWriter{w: w}
	row := func(k string, v any) {
		if s := fmt.Sprint(v); s != "" && s != "0" {
			tw.add(printable(k, ""), printable(s, ""))
		}
	}
	row("id", r.ID)
	row("state", r.State)
	if r.Resolution != nil {
		row("resolved", fmt.Sprintf("%s at %s by %s (run %s): %s", r.Resolution.Kind, r.Resolution.At.Format(time.RFC3339), r.Resolution.By, r.Resolution.Run, r.Resolution.Reason))
		if !r.Resolution.Verified {
			row("resolved by", "an event NOT verified: "+r.Resolution.Unverified)
		}
	}
	row("queue", r.Queue)
	row("owner", strings.TrimSpace(r.Owner.Team+" "+r.Owner.Contact))
	row("intake", r.Intake)
	row("stored", r.StoredAt.Format(time.RFC3339)+" ("+age(now, r.StoredAt)+" ago)")
	row("source", e.Source)
	row("envelope", envelopeTrust(e))
	row("class", e.Class)
	row("reason", e.Reason)
	row("error", e.Error)
	row("fingerprint", e.Fingerprint)
	row("attempts", e.Attempts)
	row("prior replays", r.Redrives) // see listColumns
	row("first failure", formatTime(e.FirstFailureAt))
	row("quarantined", formatTime(e.QuarantinedAt))
	row("original", originText(e))
	row("message id", r.Properties.MessageID)
	row("idempotency key", e.IdempotencyKey)
	row("type", r.Properties.Type)
	row("schema version", e.SchemaVersion)
	row("content type", r.Properties.ContentType)
	row("trace id", e.TraceID)
	for _, v := range e.Validation {
		row("violation", violationText(v))
	}
	// What redaction changed, as the runtime or (for a record it did not
	// redact, see the notes) the keeper recorded it: a header named
	// dlxbridge-redacted on a record not verified is only a claim.
	row("redacted", strings.Join(e.Redacted, ", "))
	row("redaction failed", e.RedactionFailed)
	for _, n := range e.Notes {
		row("note", n)
	}
	headers := r.Headers()
	keys := make([]string, 0, len(headers))
	for k := range headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == wire.HeaderStack && e.Stack != "" {
			continue // printed below as lines
		}
		row("header "+k, fmt.Sprintf("%v", headers[k]))
	}
	for _, h := range hist {
		row("history", fmt.Sprintf("%s %s %s %s (prior replays %d)", h.ID, h.StoredAt.Format(time.RFC3339), h.State, h.Envelope.Class, h.Redrives))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if e.Stack != "" {
		// One indented line per stack line, each escaped on its own: a
		// forged stack's newline starts another indented line, never a row
		// or the payload heading.
		fmt.Fprintln(w, "stack:")
		for _, line := range strings.Split(e.Stack, "\n") {
			fmt.Fprintf(w, "  %s\n", printable(line, "\t"))
		}
	}
	body, how := r.Body, ""
	if !raw {
		var buf bytes.Buffer
		if json.Valid(body) && json.Indent(&buf, body, "", "  ") == nil && buf.Len() != len(body) {
			body, how = buf.Bytes(), ", indented; --raw prints it as stored"
		}
	}
	_, err := fmt.Fprintf(w, "payload (%d bytes%s):\n%s\n", len(r.Body), how, printable(string(body), "\n\t"))
	return err
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func writeStats(w io.Writer, groups []quarantine.Group, snap *quarantine.Snapshot, wide bool) error {
	t := &table{wide: wide, cols: []column{
		{name: "QUEUE", max: 12, keepEnd: true}, {name: "CLASS", max: 11}, {name: "FINGERPRINT", wideOnly: true, max: 16},
		{name: "OPEN", max: 6}, {name: "REPLAYED", max: 8}, {name: "PURGED", wideOnly: true}, {name: "EXPIRED", wideOnly: true},
		{name: "FIRST SEEN", wideOnly: true}, {name: "LAST SEEN", wideOnly: true}, {name: "LAST", narrowOnly: true, max: 8}, {name: "OLDEST OPEN", max: 11},
		{name: "OWNER", wideOnly: true}, {name: "EXAMPLE", min: 20},
	}}
	var open, replayed, purged, expired int
	for _, g := range groups {
		oldest := "-"
		if g.Open > 0 {
			oldest = time.Duration(g.OldestOpenAge).Round(time.Second).String()
		}
		t.add(printable(g.Queue, ""), printable(string(g.Class), ""), printable(g.Fingerprint, ""), fmt.Sprint(g.Open),
			fmt.Sprint(g.Replayed), fmt.Sprint(g.Purged), fmt.Sprint(g.Expired), formatTime(g.FirstSeen), formatTime(g.LastSeen), age(snap.At, g.LastSeen), oldest,
			printable(strings.TrimSpace(g.Owner.Team+" "+g.Owner.Contact), ""), printable(frame.Truncate(g.Example, 200), ""))
		open, replayed, purged, expired = open+g.Open, replayed+g.Replayed, purged+g.Purged, expired+g.Expired
	}
	if err := t.write(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "total: %d open, %d replayed, %d purged, %d expired (older than retention, never replayed or purged)\n", open, replayed, purged, expired)
	if err := writeIntakeWaiting(w, snap); err != nil {
		return err
	}
	if snap.Undecodable > 0 {
		fmt.Fprintf(w, "%d stream message(s) are not records this version reads\n", snap.Undecodable)
	}
	return nil
}

func sortedIntakes(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// writeAudit lists events; SIGNED says what this reader made of each one's
// signature (see eventSigned), and a line after the table says what its
// marks mean, when there are any.
func writeAudit(w io.Writer, events []quarantine.Event, wide, keyed bool, keyEnv string) error {
	t := &table{wide: wide, cols: []column{
		{name: "AT", wideOnly: true}, {name: "AT (UTC)", narrowOnly: true, max: 11}, {name: "QUARANTINE", wideOnly: true},
		{name: "KIND", max: 15}, {name: "SIGNED", max: 8}, {name: "BY", max: 16}, {name: "RUN", wideOnly: true}, {name: "COUNTS", wideOnly: true},
		{name: "FILTER", max: 18}, {name: "IDS", wideOnly: true}, {name: "REPAIR", wideOnly: true}, {name: "REASON", min: 16},
	}}
	unverified, ignored, verified, mismatched := 0, 0, 0, 0
	for _, e := range events {
		switch {
		case e.Ignored:
			ignored++
		case !e.Verified:
			unverified++
		}
		if e.Verified {
			verified++
		} else if strings.HasPrefix(e.Unverified, wire.HeaderEventSignature+" does not match") {
			// Signed, but not with this key (triage's problem text for an
			// event signature that is there and differs).
			mismatched++
		}
		counts := make([]string, 0, len(e.Counts))
		for k, v := range e.Counts {
			counts = append(counts, fmt.Sprintf("%s=%d", k, v))
		}
		sort.Strings(counts)
		ids := strings.Join(e.IDs, ",")
		if len(e.IDs) > 5 {
			ids = strings.Join(e.IDs[:5], ",") + fmt.Sprintf(",… (%d)", len(e.IDs))
		}
		t.add(formatTime(e.At), e.At.UTC().Format("01-02 15:04"), printable(e.Quarantine, ""), printable(e.Kind, ""), eventSigned(e),
			printable(e.By, ""), printable(e.Run, ""), printable(strings.Join(counts, " "), ""), printable(e.Filter, ""), printable(ids, ""),
			printable(e.Patch, ""), printable(e.Reason, ""))
	}
	if err := t.write(w); err != nil {
		return err
	}
	var notes []string
	switch {
	case !keyed && len(events) > 0:
		notes = append(notes, fmt.Sprintf("?: not verified: $%s is unset, so no signature was checked and every event counts; BY and the rest are the event's word", keyEnv))
	case unverified > 0:
		notes = append(notes, fmt.Sprintf("?: %d event(s) without a valid signature that no signed event precedes in its stream (an older version's, or a writer's without the key): counted, their word unverified", unverified))
	}
	if keyed && verified == 0 && mismatched > 0 {
		// A mistyped key otherwise reads like no key at all.
		notes = append(notes, fmt.Sprintf("KEY: none of the %d signed event(s) verifies with $%s: it is not the key that signed them (is it the runtime's and the other commands' key?)", mismatched, keyEnv))
	}
	if ignored > 0 {
		notes = append(notes, fmt.Sprintf("UNSIGNED: %d event(s) without a valid signature after a signed one in its stream (a forgery, or a writer without the key): they change nothing", ignored))
	}
	for _, n := range notes {
		if _, err := io.WriteString(w, wrap(n, tableWidth)); err != nil {
			return err
		}
	}
	return nil
}

// eventSigned is audit's SIGNED: "yes" (the signature verified), "?"
// (counted, not verified), or "UNSIGNED" (ignored: it changes nothing).
func eventSigned(e quarantine.Event) string {
	switch {
	case e.Verified:
		return "yes"
	case e.Ignored:
		return "UNSIGNED"
	}
	return "?"
}

func writeReplay(w io.Writer, res *quarantine.ReplayResult) error {
	for _, p := range res.Plan {
		verb := "send"
		if p.Refused != "" {
			verb = "refuse"
		}
		fmt.Fprintf(w, "%-7s %s -> %s (replay no. %d)", verb, p.ID, p.ToQueue, p.Redrives)
		if p.Refused != "" {
			fmt.Fprintf(w, ": %s", printable(p.Refused, ""))
		}
		fmt.Fprintln(w)
	}
	if res.DryRun {
		_, err := fmt.Fprintf(w, "dry run: %d selected, %d would be sent; nothing changed\n", res.Selected, len(res.Plan)-len(res.Invalid)-len(res.OverBudget))
		return err
	}
	if res.Selected == 0 {
		// No job was recorded: naming one would send the reader to
		// `quarantine jobs` for an id it does not know.
		_, err := fmt.Fprintln(w, "nothing selected: no record matched the filters; nothing replayed")
		return err
	}
	_, err := fmt.Fprintf(w, "replayed %d of %d selected in %s; %d invalid, %d over budget\njob %s: what became of them: dlxbridge quarantine jobs %s\n",
		len(res.Sent), res.Selected, time.Duration(res.Duration).Round(time.Millisecond), len(res.Invalid), len(res.OverBudget), res.Run, res.Run)
	return err
}

// printable returns s with every control character but those in keep,
// every bidirectional-text control and every byte that is not UTF-8
// escaped as in a Go string literal. Record text comes from producers (and
// handlers quoting them): on an on-call engineer's terminal it must not
// move the cursor, erase or fake a line, or set the title or clipboard.
func printable(s, keep string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case (unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)) && !strings.ContainsRune(keep, r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// envSigner is the Signer for the consumers' key, read with getenv from
// the variable security.signing_key_env names, or nil when it is unset or
// empty.
func envSigner(getenv func(string) string, cfg *config.Config) (*triage.Signer, error) {
	env := cfg.Security.SigningKeyEnv
	key := getenv(env)
	if env == "" || key == "" {
		return nil, nil
	}
	signer, err := triage.NewSigner([]byte(key))
	if err != nil {
		return nil, fmt.Errorf("$%s: %w", env, err)
	}
	return signer, nil
}

// listState is list's STATE: a "?" after replayed or purged when the event
// that resolved the record was not verified (see listColumns).
func listState(r *quarantine.Record) string {
	if r.Resolution != nil && !r.Resolution.Verified {
		return string(r.State) + "?"
	}
	return string(r.State)
}

// listClass is list's CLASS: the class, marked when an envelope that
// claims to be the bridge's was not verified (see listColumns).
func listClass(e quarantine.Envelope) string {
	c := printable(string(e.Class), "")
	switch {
	case e.Source == quarantine.SourceUnverified:
		return "(unverified)"
	case e.Source == quarantine.SourceBridge && !e.Verified:
		return c + "?"
	}
	return c
}

// envelopeTrust says for show whether the envelope's fields are the
// runtime's (signature verified) or someone's claim.
func envelopeTrust(e quarantine.Envelope) string {
	switch {
	case e.Verified:
		return "signed by the runtime (signature verified when stored)"
	case e.Source == quarantine.SourceBridge:
		return "NOT verified: no valid envelope signature was checked (stored before envelopes were signed, or by a keeper without the consumers' key); every field is the message's claim"
	case e.Source == quarantine.SourceBroker:
		return "none: read from the broker's x-death (not verified)"
	}
	return "NOT verified: see the notes"
}

// originText is a record's origin for show: exchange, routing key, queue.
// The default exchange is named, so that "orders orders" (published to
// queue orders directly, or replayed without a key: see the notes) does
// not read as an exchange called orders.
func originText(e quarantine.Envelope) string {
	if e.OriginalExchange == "" && e.OriginalRouting == "" && e.OriginalQueue == "" {
		return ""
	}
	ex := e.OriginalExchange
	if ex == "" {
		ex = "(default exchange)"
	}
	return strings.TrimSpace(fmt.Sprintf("%s %s %s", ex, e.OriginalRouting, e.OriginalQueue))
}
