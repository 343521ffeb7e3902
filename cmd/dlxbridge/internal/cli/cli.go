// Package cli is the dlxbridge command line. cmd/dlxbridge only calls Main;
// commands write to the io.Writers they are given so tests can run them.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sort"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// Exit codes.
const (
	ExitOK    = 0 // success
	ExitFail  = 1 // drift found, invalid input, or the broker refused
	ExitUsage = 2 // bad usage or bad config
	// ExitIncomplete: topology plan or verify found nothing wrong in what
	// it could check, but some checks could not run (without the
	// management API: bindings, policies, every differing argument); the
	// report names them.
	ExitIncomplete = 3
)

// Env is what a command gets from the process.
type Env struct {
	Stdout, Stderr io.Writer
	Stdin          io.Reader
	// Getenv reads the environment (os.Getenv in production).
	Getenv func(string) string
}

type command struct {
	summary string
	run     func(ctx context.Context, env *Env, args []string) int
}

func commands() map[string]command {
	return map[string]command{
		"topology":   {"plan, apply, verify or delete the broker topology", runTopology},
		"audit":      {"the dead-letter safety of every queue on a broker (read-only, management API)", runAudit},
		"schemas":    {"list, lint and validate against the schema registry", runSchemas},
		"quarantine": {"list, show, stats, replay, purge, audit, export and replay jobs of quarantined messages", runQuarantine},
		"bench":      {"the runtime beside a plain amqp091-go consumer, every id reconciled", runBench},
		"demo":       {"show the whole job on a throwaway topology: publish a mix, handle, retry, quarantine", runDemo},
		"run":        {"consume the queues and forward each message to a local HTTP endpoint (the sidecar)", runRun},
		"version":    {"the binary's version, VCS revision and Go version", runVersion},
	}
}

// Main runs the command line and returns the exit code.
func Main(ctx context.Context, args []string, env *Env) int {
	if env.Getenv == nil {
		env.Getenv = os.Getenv
	}
	if len(args) == 0 {
		usage(env.Stderr)
		return ExitUsage
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(env.Stdout)
		return ExitOK
	}
	if args[0] == "--version" || args[0] == "-version" {
		return runVersion(ctx, env, nil)
	}
	cmd, ok := commands()[args[0]]
	if !ok {
		fmt.Fprintf(env.Stderr, "dlxbridge: unknown command %q\n\n", args[0])
		usage(env.Stderr)
		return ExitUsage
	}
	return cmd.run(ctx, env, args[1:])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: dlxbridge <command> [subcommand] [flags]")
	fmt.Fprintln(w, "\ncommands:")
	cmds := commands()
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'dlxbridge <command> -h' for its flags.")
}

// common holds the flags shared by broker-facing commands.
type common struct {
	configPath string
	url        string
	output     string
}

func (c *common) register(fs *flag.FlagSet, env *Env) {
	fs.StringVar(&c.configPath, "config", "config.yaml", "path to the config file ($RABBITMQ_MANAGEMENT_URL, when set, replaces its broker.management_url)")
	local, _ := amqpx.ParseAMQPURL(amqpx.DefaultURL)
	fs.StringVar(&c.url, "url", "", "AMQP URL, or several nodes' URLs comma separated (default $RABBITMQ_URL, else "+local.String()+" with the default password)")
	fs.StringVar(&c.output, "output", "text", "output format: text or json")
}

// checkedURL is brokerURL, checked the way amqp091-go will read it (one
// URL, or several nodes' comma separated). A URL that does not parse is
// reported on stderr under cmd (its error quotes nothing of the URL) and ok
// is false: the command exits ExitUsage.
func (c *common) checkedURL(env *Env, cmd string) (url string, ok bool) {
	url, from := c.brokerURL(env)
	if _, err := amqpx.ParseURLList(url); err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge %s: %s: %v\n", cmd, from, err)
		return "", false
	}
	return url, true
}

// dial connects a command to the first node of url (checked by
// checkedURL) that answers, riding out a few seconds in which none does
// (a node restarting). With several nodes it says on stderr which node it
// reached, and each node it passed over; with one, only why it waits.
func dial(ctx context.Context, env *Env, url, name string) (*amqp.Connection, error) {
	d, err := amqpx.NewDialer(url)
	if err != nil {
		return nil, err
	}
	level := slog.LevelWarn
	if len(d.Endpoints()) > 1 {
		level = slog.LevelInfo
	}
	d.Logger = slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: level}))
	conn, _, err := d.DialRetry(ctx, name, amqpx.Retry{})
	return conn, err
}

// brokerURL resolves --url, then RABBITMQ_URL, then the default, and says
// which it took.
func (c *common) brokerURL(env *Env) (url, from string) {
	if c.url != "" {
		return c.url, "--url"
	}
	if u := env.Getenv("RABBITMQ_URL"); u != "" {
		return u, "$RABBITMQ_URL"
	}
	return amqpx.DefaultURL, "the default URL"
}

func (c *common) checkOutput(env *Env) bool {
	if c.output != "text" && c.output != "json" {
		fmt.Fprintf(env.Stderr, "dlxbridge: --output must be text or json, not %q\n", c.output)
		return false
	}
	return true
}

// loadConfig loads the config, printing every problem on failure.
func loadConfig(env *Env, path string) (*config.Config, bool) {
	cfg, err := config.Load(path)
	if err != nil {
		if es, ok := config.AsErrors(err); ok {
			fmt.Fprintf(env.Stderr, "dlxbridge: %s is invalid:\n", path)
			for _, e := range es {
				fmt.Fprintf(env.Stderr, "  %s\n", e.Error())
			}
		} else if errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(env.Stderr, "dlxbridge: no config file %s (pass --config <file>; config.yaml at the repository's top is an example)\n", path)
		} else {
			fmt.Fprintf(env.Stderr, "dlxbridge: %v\n", err)
		}
		return nil, false
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(env.Stderr, "dlxbridge: warning: %s: %s\n", path, w.Error())
	}
	// As RABBITMQ_URL stands in for --url, RABBITMQ_MANAGEMENT_URL stands
	// in for broker.management_url: one config file then serves brokers
	// whose management API differs (a 3.x and a 4.x node, say).
	if u := env.Getenv("RABBITMQ_MANAGEMENT_URL"); u != "" {
		cfg.Broker.ManagementURL = u
		if err := cfg.Validate(); err != nil {
			fmt.Fprintf(env.Stderr, "dlxbridge: $RABBITMQ_MANAGEMENT_URL: %v\n", err)
			return nil, false
		}
	}
	return cfg, true
}

// newFlagSet makes a FlagSet that reports errors instead of exiting.
func newFlagSet(env *Env, name, usageLine string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: dlxbridge %s\n\nflags:\n", usageLine)
		fs.PrintDefaults()
	}
	return fs
}

// asksForHelp reports whether args hold -h, -help or --help before the
// first "--", where the flag package would take it.
func asksForHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// subcmd is one subcommand of a command group, for its usage text.
type subcmd struct{ name, summary string }

// subcommand splits "sub --flags..." and checks sub is one of subs. When it
// returns ok false, the caller exits with code: ExitOK after -h, --help or
// help (the group's usage, as the top-level usage promises), else
// ExitUsage.
func subcommand(env *Env, group string, args []string, subs ...subcmd) (sub string, rest []string, code int, ok bool) {
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.name
	}
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help", "help":
			groupUsage(env.Stdout, group, subs)
			return "", nil, ExitOK, false
		}
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		groupUsage(env.Stderr, group, subs)
		return "", nil, ExitUsage, false
	}
	for _, s := range subs {
		if args[0] == s.name {
			return s.name, args[1:], 0, true
		}
	}
	fmt.Fprintf(env.Stderr, "dlxbridge %s: unknown subcommand %q (want %s)\n", group, args[0], strings.Join(names, ", "))
	return "", nil, ExitUsage, false
}

func groupUsage(w io.Writer, group string, subs []subcmd) {
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.name
	}
	fmt.Fprintf(w, "usage: dlxbridge %s %s [flags]\n\nsubcommands:\n", group, strings.Join(names, "|"))
	for _, s := range subs {
		fmt.Fprintf(w, "  %-9s %s\n", s.name, s.summary)
	}
	fmt.Fprintf(w, "\nRun 'dlxbridge %s <subcommand> -h' for its flags.\n", group)
}

// parseFlags parses args and reports the exit code to return, if any.
func parseFlags(env *Env, fs *flag.FlagSet, args []string) (int, bool) {
	if asksForHelp(args) {
		// Asked-for help is the command's output (dlxbridge quarantine
		// list -h | less); the usage after a flag error stays on stderr.
		fs.SetOutput(env.Stdout)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK, false
		}
		return ExitUsage, false
	}
	return 0, true
}

// parseCommand is parseFlags for a command that takes no arguments beside
// its flags.
func parseCommand(env *Env, fs *flag.FlagSet, cmd string, args []string) (int, bool) {
	if code, ok := parseFlags(env, fs, args); !ok {
		return code, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(env.Stderr, "dlxbridge %s: unexpected argument %q\n", cmd, fs.Arg(0))
		return ExitUsage, false
	}
	return 0, true
}
