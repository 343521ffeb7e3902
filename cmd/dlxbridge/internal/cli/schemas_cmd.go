package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/wire"
)

// runSchemas: dlxbridge schemas lint|validate|list.
//
// Exit codes: lint 1 when any file is broken; validate 1 when the message is
// invalid; 2 for bad usage, a missing directory, or (validate, list) a
// registry that does not load.
func runSchemas(ctx context.Context, env *Env, args []string) int {
	sub, rest, code, ok := subcommand(env, "schemas", args,
		subcmd{"list", "the registry's message types and versions"},
		subcmd{"lint", "compile every schema and list each broken file"},
		subcmd{"validate", "validate one message body against its schema"})
	if !ok {
		return code
	}
	switch sub {
	case "lint":
		return schemasLint(env, rest)
	case "validate":
		return schemasValidate(ctx, env, rest)
	default:
		return schemasList(env, rest)
	}
}

// registryFlags are the flags that say where the registry comes from.
type registryFlags struct {
	dir        string
	noEmbedded bool
}

func (r *registryFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.dir, "dir", "", "schema directory (<type>/v<N>.json) loaded on top of the embedded registry")
	fs.BoolVar(&r.noEmbedded, "no-embedded", false, "leave out the embedded registry (use --dir alone)")
}

func (r *registryFlags) options() schemas.LoadOptions {
	return schemas.LoadOptions{Dir: r.dir, NoEmbedded: r.noEmbedded}
}

// loadRegistry loads the registry; on failure it prints every broken file.
func loadRegistry(env *Env, cmd string, opts schemas.LoadOptions) (*schemas.Registry, bool) {
	reg, err := schemas.Load(opts)
	if err != nil {
		var le *schemas.LoadError
		if errors.As(err, &le) {
			fmt.Fprintf(env.Stderr, "dlxbridge schemas %s: the registry has %d broken file(s); run 'dlxbridge schemas lint'\n", cmd, len(le.Files))
		} else {
			fmt.Fprintf(env.Stderr, "dlxbridge schemas %s: %v\n", cmd, err)
		}
		return nil, false
	}
	return reg, true
}

// schemasLint compiles the whole registry and lists each broken file.
func schemasLint(env *Env, args []string) int {
	fs := newFlagSet(env, "schemas lint", "schemas lint [--dir DIR] [--no-embedded]")
	var rf registryFlags
	rf.register(fs)
	if code, ok := parseCommand(env, fs, "schemas lint", args); !ok {
		return code
	}
	reg, err := schemas.Load(rf.options())
	if err != nil {
		var le *schemas.LoadError
		if !errors.As(err, &le) {
			fmt.Fprintf(env.Stderr, "dlxbridge schemas lint: %v\n", err)
			return ExitUsage
		}
		for _, f := range le.Files {
			fmt.Fprintf(env.Stdout, "%s: %v\n", f.Source, f.Err)
		}
		fmt.Fprintf(env.Stderr, "dlxbridge schemas lint: %d broken file(s)\n", len(le.Files))
		return ExitFail
	}
	fmt.Fprintf(env.Stdout, "ok: %d schemas compiled\n", len(reg.Refs()))
	return ExitOK
}

// schemasValidate validates one body (a file or stdin) against a type's
// schema, printing each violation as "pointer keyword: message".
func schemasValidate(ctx context.Context, env *Env, args []string) int {
	fs := newFlagSet(env, "schemas validate", "schemas validate --type TYPE [--version N] [--dir DIR] FILE|-")
	var rf registryFlags
	rf.register(fs)
	typ := fs.String("type", "", "message type, e.g. orders.created (required)")
	version := fs.String("version", "", "schema version (default: the highest)")
	maxBody := fs.Int("max-body-bytes", schemas.DefaultMaxBodyBytes, "largest body accepted")
	if code, ok := parseFlags(env, fs, args); !ok {
		return code
	}
	if *typ == "" || fs.NArg() != 1 || *maxBody <= 0 {
		switch {
		case *typ == "":
			fmt.Fprintln(env.Stderr, "dlxbridge schemas validate: --type is required (see 'dlxbridge schemas list')")
		case fs.NArg() != 1:
			fmt.Fprintln(env.Stderr, "dlxbridge schemas validate: one body to validate: a file, or - for stdin")
		}
		fs.Usage()
		return ExitUsage
	}
	reg, ok := loadRegistry(env, "validate", rf.options())
	if !ok {
		return ExitUsage
	}
	v := schemas.NormalizeVersion(*version)
	if v == "" {
		if v, ok = reg.Latest(*typ); !ok {
			fmt.Fprintf(env.Stderr, "dlxbridge schemas validate: type %q is not in the registry (see 'dlxbridge schemas list')\n", *typ)
			return ExitUsage
		}
	}
	if _, ok := reg.Lookup(*typ, v); !ok {
		fmt.Fprintf(env.Stderr, "dlxbridge schemas validate: %s v%s is not in the registry (see 'dlxbridge schemas list')\n", *typ, v)
		return ExitUsage
	}
	// A queue that accepts just this type and version, with the default
	// identity: the gate the runtime would build for it.
	q := config.Queue{Accepts: []config.Accept{{Type: *typ, Versions: []string{v}}}}
	gate, err := schemas.NewGate(q.GateConfig(reg, *maxBody))
	if err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge schemas validate: %v\n", err)
		return ExitUsage
	}
	body, err := readBody(env, fs.Arg(0), *maxBody)
	if err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge schemas validate: %v\n", err)
		return ExitUsage
	}
	_, err = gate.CheckContext(ctx, schemas.Input{
		Type:    *typ,
		Headers: map[string]any{wire.DefaultVersionHeader: v},
		Body:    body,
	})
	if errors.Is(err, schemas.ErrStopped) {
		fmt.Fprintf(env.Stderr, "dlxbridge schemas validate: stopped before the check finished (%v)\n", err)
		return ExitFail
	}
	if err == nil {
		fmt.Fprintf(env.Stdout, "valid: %s v%s\n", *typ, v)
		return ExitOK
	}
	var verr *schemas.ValidationError
	if !errors.As(err, &verr) {
		fmt.Fprintf(env.Stderr, "dlxbridge schemas validate: %v\n", err)
		return ExitFail
	}
	if verr.Detail != "" {
		fmt.Fprintf(env.Stdout, "%s: %s\n", verr.Reason, verr.Detail)
	}
	for _, vi := range verr.Violations {
		fmt.Fprintln(env.Stdout, vi.String())
	}
	if verr.Truncated {
		fmt.Fprintf(env.Stdout, "(more violations not shown)\n")
	}
	if verr.Reason == schemas.ReasonInvalid {
		fmt.Fprintf(env.Stderr, "dlxbridge schemas validate: invalid %s v%s\n", *typ, v)
	} else {
		fmt.Fprintf(env.Stderr, "dlxbridge schemas validate: invalid %s v%s (%s)\n", *typ, v, verr.Reason)
	}
	return ExitFail
}

// readBody reads a file, or stdin for "-", up to max+1 bytes so the gate can
// still report a body that is too large.
func readBody(env *Env, name string, max int) ([]byte, error) {
	var r io.Reader
	if name == "-" {
		if env.Stdin == nil {
			return nil, errors.New("no standard input")
		}
		r = env.Stdin
	} else {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	return io.ReadAll(io.LimitReader(r, int64(max)+1))
}

// schemasList prints every message type and version in the registry, then,
// apart, the files of shared definitions (e.g. common), which are not
// message types.
func schemasList(env *Env, args []string) int {
	fs := newFlagSet(env, "schemas list", "schemas list [--dir DIR] [--output text|json]")
	var rf registryFlags
	rf.register(fs)
	output := fs.String("output", "text", "output format: text or json")
	if code, ok := parseCommand(env, fs, "schemas list", args); !ok {
		return code
	}
	if *output != "text" && *output != "json" {
		fmt.Fprintf(env.Stderr, "dlxbridge: --output must be text or json, not %q\n", *output)
		return ExitUsage
	}
	reg, ok := loadRegistry(env, "list", rf.options())
	if !ok {
		return ExitUsage
	}
	refs := reg.Refs()
	err := render(env.Stdout, *output, refs, func(w io.Writer) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		sep := ""
		for _, kind := range []string{schemas.KindMessage, schemas.KindDefinitions} {
			heading := map[string]string{schemas.KindMessage: "TYPE", schemas.KindDefinitions: "DEFINITIONS"}[kind]
			for _, r := range refs {
				if r.Kind != kind {
					continue
				}
				if heading != "" {
					fmt.Fprintf(tw, "%s%s\tVERSION\tSOURCE\n", sep, heading)
					heading, sep = "", "\n"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Type, r.Version, r.Source)
			}
		}
		return tw.Flush()
	})
	if err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge schemas list: %v\n", err)
		return ExitFail
	}
	return ExitOK
}
