package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/dlxbridge/dlxbridge/topology"
)

// runTopology: dlxbridge topology plan|apply|verify|delete.
//
// The config is loaded and validated before anything dials the broker, so a
// bad file (exit 2) declares nothing; so does a URL that does not parse
// (exit 2). Exit 1: verify found drift, plan found a conflicting object (so
// apply would refuse), apply was refused, or the broker could not be
// reached or refused the login, or delete kept (or, with --dry-run, would
// keep) a queue that holds data or an exchange in use. Exit 3: plan or verify could not check
// everything (no management API) and found nothing wrong in what it could. A configured management API that
// does not answer (or is another broker's) is warned about, and the
// command goes on over AMQP, except delete (with or without --dry-run),
// which then refuses with exit 2, giving the cause and no warning, unless
// --without-management.
func runTopology(ctx context.Context, env *Env, args []string) int {
	sub, rest, code, ok := subcommand(env, "topology", args,
		subcmd{"plan", "what apply would create, what exists, what conflicts; declares nothing"},
		subcmd{"apply", "declare everything that is missing; refuses if an object conflicts"},
		subcmd{"verify", "report drift between the broker and the config"},
		subcmd{"delete", "delete the config's queues and exchanges; keeps any that hold data unless --include-data"})
	if !ok {
		return code
	}
	usageLine := "topology " + sub + " [--config config.yaml] [--url amqp://...] [--output text|json]"
	if sub == "delete" {
		usageLine = "topology delete [--dry-run] [--include-data | --retired] [--without-management] [--config config.yaml] [--url amqp://...] [--output text|json]"
	}
	fs := newFlagSet(env, "topology "+sub, usageLine)
	var c common
	c.register(fs, env)
	var del topology.DeleteOptions
	if sub == "delete" {
		fs.BoolVar(&del.DryRun, "dry-run", false, "print what would be deleted or kept (with message counts); delete nothing. Refuses where the delete would (no management API without --without-management)")
		fs.BoolVar(&del.IncludeData, "include-data", false, "also delete queues that hold messages and the quarantine's streams (its records and audit trail)")
		fs.BoolVar(&del.Retired, "retired", false, "delete only the per-queue retry lanes and exchanges that queues moved to the shared tiers no longer use, each once it is empty (what a lane holds still returns to its work queue)")
		fs.BoolVar(&del.WithoutManagement, "without-management", false, "delete without the management API (broker.management_url): objects of another type under the config's names, and queues other configs route into, are then deleted when empty")
	}
	if code, ok := parseCommand(env, fs, "topology "+sub, rest); !ok {
		return code
	}
	if !c.checkOutput(env) {
		return ExitUsage
	}
	if del.Retired && del.IncludeData {
		fmt.Fprintf(env.Stderr, "dlxbridge topology delete: --retired deletes only empty lanes; it does not take --include-data\n")
		return ExitUsage
	}
	cfg, ok := loadConfig(env, c.configPath)
	if !ok {
		return ExitUsage
	}
	url, ok := c.checkedURL(env, "topology "+sub)
	if !ok {
		return ExitUsage
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(env.Stderr, "dlxbridge topology %s: %s\n", sub, fmt.Sprintf(format, a...))
		return ExitFail
	}

	var mgmt *topology.Management
	if cfg.Broker.ManagementURL != "" {
		m, err := topology.NewManagement(cfg.Broker.ManagementURL, url)
		if err != nil {
			fmt.Fprintf(env.Stderr, "dlxbridge topology %s: %s: broker.management_url: %v\n", sub, c.configPath, err)
			return ExitUsage
		}
		mgmt = m
	}
	conn, err := dial(ctx, env, url, "dlxbridge/topology-"+sub)
	if err != nil {
		return fail("%v", err)
	}
	defer conn.Close()
	in := &topology.Broker{Conn: conn}
	if mgmt != nil {
		// delete refuses without the API (its refusal gives the cause)
		// unless --without-management: "going on" would contradict it.
		if err := in.UseManagement(ctx, mgmt); err != nil && (sub != "delete" || del.WithoutManagement) {
			fmt.Fprintf(env.Stderr, "dlxbridge topology %s: warning: %s; going on with what AMQP can check\n", sub, err)
		}
	}
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		return fail("%v", err)
	}

	switch sub {
	case "plan":
		p, err := in.Plan(ctx, topo)
		if err != nil {
			return fail("%v", err)
		}
		if err := render(env.Stdout, c.output, p, p.WriteText); err != nil {
			return fail("%v", err)
		}
		switch {
		case p.Summary.Conflict > 0: // apply would refuse
			return ExitFail
		case !p.Complete():
			return ExitIncomplete
		}
		return ExitOK
	case "apply":
		p, err := in.Apply(ctx, topo)
		if p != nil {
			if rerr := render(env.Stdout, c.output, p, p.WriteText); rerr != nil {
				return fail("%v", rerr)
			}
		}
		if err != nil {
			return fail("%v", err)
		}
		return ExitOK
	case "delete":
		r, err := in.Delete(ctx, topo, del)
		if errors.Is(err, topology.ErrDeleteNeedsManagement) {
			fmt.Fprintf(env.Stderr, "dlxbridge topology delete: %s: %v\n", c.configPath, err)
			return ExitUsage
		}
		if r != nil {
			if rerr := render(env.Stdout, c.output, r, r.WriteText); rerr != nil {
				return fail("%v", rerr)
			}
		}
		if err != nil {
			return fail("%v", err)
		}
		if !r.OK() {
			return fail("kept %s", strings.Join(r.Kept(), ", "))
		}
		return ExitOK
	default: // verify
		r, err := in.Verify(ctx, topo)
		if err != nil {
			return fail("%v", err)
		}
		if err := render(env.Stdout, c.output, r, r.WriteText); err != nil {
			return fail("%v", err)
		}
		switch {
		case !r.OK():
			return ExitFail
		case !r.Complete():
			return ExitIncomplete
		}
		return ExitOK
	}
}

// render writes v as indented JSON or through its text method.
func render(w io.Writer, output string, v any, text func(io.Writer) error) error {
	if output != "json" {
		return text(w)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
