package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/dlxbridge/dlxbridge/quarantine"
)

// runJobs is `quarantine jobs [ID]` and `quarantine jobs cancel ID`: every
// replay (the CLI's, the page's, automatic redrive's) as a job, read from
// the events streams.
func runJobs(ctx context.Context, env *Env, args []string) int {
	cancel := len(args) > 0 && args[0] == "cancel"
	usage := "quarantine jobs [ID]"
	if cancel {
		args, usage = args[1:], "quarantine jobs cancel ID [--reason TEXT]"
	}
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	fs := newFlagSet(env, usage, usage+" [--config config.yaml] [--url amqp://...] [--output text|json]")
	var c common
	c.register(fs, env)
	wide, reason, limit := new(bool), new(string), new(int)
	if cancel {
		fs.StringVar(reason, "reason", "", "why, for the audit trail")
	} else {
		fs.BoolVar(wide, "wide", false, fmt.Sprintf("show every column, uncut (by default the table fits %d columns)", tableWidth))
		fs.IntVar(limit, "limit", 50, "list at most the N newest jobs (0: all)")
	}
	if code, ok := parseFlags(env, fs, args); !ok {
		return code
	}
	if id == "" && fs.NArg() == 1 {
		id = fs.Arg(0)
	} else if fs.NArg() > 0 || cancel && id == "" {
		fmt.Fprintln(env.Stderr, "usage: dlxbridge "+usage)
		return ExitUsage
	}
	if !c.checkOutput(env) {
		return ExitUsage
	}
	cfg, ok := loadConfig(env, c.configPath)
	if !ok {
		return ExitUsage
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine jobs: %s\n", fmt.Sprintf(format, a...))
		return ExitFail
	}
	// With the key, an outcome or a cancel no valid signature vouches for
	// counts for nothing once its stream holds a signed event. A key that
	// is set but unusable is a setup mistake, said before connecting.
	verifier, err := envSigner(env.Getenv, cfg)
	if err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge quarantine jobs: %v\n", err)
		return ExitUsage
	}
	url, ok := c.checkedURL(env, "quarantine jobs")
	if !ok {
		return ExitUsage
	}
	conn, err := dial(ctx, env, url, cfg.Broker.ConnectionName+"/quarantine-jobs")
	if err != nil {
		return fail("%v", err)
	}
	defer conn.Close()
	if cancel {
		if verifier == nil {
			fmt.Fprintf(env.Stderr, "dlxbridge quarantine jobs cancel: $%s is unset: a replay run with the key ignores an unsigned cancel\n", cfg.Security.SigningKeyEnv)
		}
		rp := &quarantine.Replayer{Conn: conn, Config: cfg, Signer: verifier}
		j, err := rp.CancelJob(ctx, id, *reason)
		if err != nil {
			return fail("%v", err)
		}
		return renderOr(env, c.output, fail, map[string]any{"cancel_requested": j.ID}, func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "asked job %s to stop after the message in flight (%d of %d sent); the rest stay open\n", j.ID, j.Confirmed, j.ToSend)
			return err
		})
	}
	in := &quarantine.Inspector{Conn: conn, Config: cfg, Verifier: verifier, OmitBodies: true}
	jobs, err := in.Jobs(ctx)
	if err != nil {
		return fail("%v", err)
	}
	if id != "" {
		j, err := quarantine.FindJob(jobs, id)
		if err != nil {
			if errors.Is(err, quarantine.ErrNoJob) {
				hint := ""
				if len(id) < 4 {
					// A shorter prefix is never matched: say so, or "ab"
					// reads as "no job starts with ab".
					hint = " (a prefix of a job id needs at least 4 characters)"
				}
				fmt.Fprintf(env.Stderr, "dlxbridge quarantine jobs: %v%s\n", err, hint)
				return ExitFail
			}
			return fail("%v", err)
		}
		return renderOr(env, c.output, fail, j, func(w io.Writer) error { return writeJob(w, j, *wide) })
	}
	total := len(jobs)
	if *limit > 0 && len(jobs) > *limit {
		jobs = jobs[:*limit]
	}
	for i := range jobs {
		jobs[i].Messages = nil // the list is the counts; jobs ID has them
	}
	return renderOr(env, c.output, fail, map[string]any{"total": total, "jobs": nonNil(jobs)}, func(w io.Writer) error {
		if total > len(jobs) {
			defer fmt.Fprintf(w, "%d of %d jobs (--limit)\n", len(jobs), total)
		}
		return writeJobs(w, jobs, *wide)
	})
}

// jobTable: JOB STATE BY AGE and the counts, fitted to 100 columns
// (--wide: STARTED, the time, and STOP instead of AGE).
func jobTable(wide bool) *table {
	return &table{wide: wide, cols: []column{
		{name: "JOB", max: 12}, {name: "STATE", max: 9}, {name: "BY", min: 6},
		{name: "AGE", max: 4, narrowOnly: true}, {name: "STARTED (UTC)", wideOnly: true},
		{name: "SELECTED", max: 8}, {name: "SENT", max: 5}, {name: "CONFIRMED", max: 9},
		{name: "REFUSED", max: 7}, {name: "HANDLED", max: 7}, {name: "AGAIN", max: 5}, {name: "PENDING", max: 7},
		{name: "STOP", wideOnly: true},
	}}
}

func addJob(t *table, j *quarantine.Job, now time.Time) {
	n := strconv.Itoa
	state := j.State
	if j.Unverified {
		state += "?"
	}
	t.add(printable(j.ID, ""), state, printable(j.By, ""), shortAge(now.Sub(j.Started)), formatTime(j.Started),
		n(j.Selected), n(j.Sent), n(j.Confirmed), n(j.Refused), n(j.Handled), n(j.QuarantinedAgain), n(j.Pending),
		printable(j.Stop, ""))
}

// shortAge is d in one unit: 42s, 17m, 5h, 3d.
func shortAge(d time.Duration) string {
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(max(d, 0)/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d"
}

func writeJobs(w io.Writer, jobs []quarantine.Job, wide bool) error {
	if len(jobs) == 0 {
		_, err := io.WriteString(w, "no replay jobs\n")
		return err
	}
	t := jobTable(wide)
	now := time.Now()
	for i := range jobs {
		addJob(t, &jobs[i], now)
	}
	if err := t.write(w); err != nil {
		return err
	}
	return writeJobNotes(w, jobs)
}

func writeJobNotes(w io.Writer, jobs []quarantine.Job) error {
	for _, j := range jobs {
		if j.Unverified {
			_, err := io.WriteString(w, wrap("?: a job marked so counted events without a valid signature (read without the key, or written before signing began): its counts are their word", tableWidth))
			return err
		}
	}
	return nil
}

// writeJob prints one job: its counts, why it stopped, and each message's
// outcome.
func writeJob(w io.Writer, j *quarantine.Job, wide bool) error {
	t := jobTable(wide)
	addJob(t, j, time.Now())
	if err := t.write(w); err != nil {
		return err
	}
	lines := []string{"filter: " + printable(j.Filter, "")}
	if j.Reason != "" {
		lines = append(lines, "reason: "+printable(j.Reason, ""))
	}
	if j.Stop != "" {
		lines = append(lines, "stop: "+printable(j.Stop, ""))
	}
	for _, win := range j.Windows {
		lines = append(lines, fmt.Sprintf("outage: %s %s to %s", printable(win.Queue, ""), formatTime(win.From), formatTime(win.Until)))
	}
	for _, l := range lines {
		if _, err := io.WriteString(w, wrap(l, tableWidth)); err != nil {
			return err
		}
	}
	if len(j.Messages) == 0 {
		return writeJobNotes(w, []quarantine.Job{*j})
	}
	mt := &table{wide: wide, cols: []column{{name: "RECORD", max: 12}, {name: "TO QUEUE", min: 10, keepEnd: true}, {name: "OUTCOME", max: 17}, {name: "AT (UTC)", max: 19}}}
	for _, m := range j.Messages {
		at := ""
		if !m.At.IsZero() {
			at = formatTime(m.At)
		}
		mt.add(printable(m.ID, ""), printable(m.ToQueue, ""), m.Outcome, at)
	}
	if _, err := io.WriteString(w, "\n"); err != nil {
		return err
	}
	if err := mt.write(w); err != nil {
		return err
	}
	return writeJobNotes(w, []quarantine.Job{*j})
}
