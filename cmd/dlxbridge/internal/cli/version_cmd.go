package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
)

// buildInfo is what `dlxbridge version` reports: enough to tell two
// binaries apart in a bug report.
type buildInfo struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"revision_time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
	AMQP     string `json:"amqp091_go,omitempty"`
}

// readBuildInfo reads the binary's build information; a binary built
// without module support reports "unknown".
func readBuildInfo() buildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return buildInfo{Module: "github.com/dlxbridge/dlxbridge", Version: "unknown", Go: "unknown"}
	}
	out := buildInfo{Module: bi.Main.Path, Version: bi.Main.Version, Go: bi.GoVersion}
	if out.Version == "" {
		out.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			out.Revision = s.Value
		case "vcs.time":
			out.Time = s.Value
		case "vcs.modified":
			out.Modified = s.Value == "true"
		}
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/rabbitmq/amqp091-go" {
			out.AMQP = d.Version
			if d.Replace != nil {
				out.AMQP = d.Replace.Version + " (replaced)"
			}
		}
	}
	return out
}

func runVersion(_ context.Context, env *Env, args []string) int {
	fs := newFlagSet(env, "version", "version [flags]")
	output := fs.String("output", "text", "output format: text or json")
	if code, ok := parseCommand(env, fs, "version", args); !ok {
		return code
	}
	bi := readBuildInfo()
	switch *output {
	case "json":
		b, _ := json.Marshal(bi)
		fmt.Fprintln(env.Stdout, string(b))
	case "text":
		fmt.Fprintf(env.Stdout, "dlxbridge %s\n", bi.Version)
		if bi.Revision != "" {
			dirty := ""
			if bi.Modified {
				dirty = " (modified)"
			}
			fmt.Fprintf(env.Stdout, "revision  %s%s %s\n", bi.Revision, dirty, bi.Time)
		} else {
			fmt.Fprintln(env.Stdout, "revision  unknown (built without version control information: -buildvcs=false, or outside a git checkout)")
		}
		fmt.Fprintf(env.Stdout, "go        %s\n", bi.Go)
		if bi.AMQP != "" {
			fmt.Fprintf(env.Stdout, "amqp091-go %s\n", bi.AMQP)
		}
	default:
		fmt.Fprintf(env.Stderr, "dlxbridge version: --output must be text or json, not %q\n", *output)
		return ExitUsage
	}
	return ExitOK
}
