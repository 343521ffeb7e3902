package cli

import (
	"context"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/bench"
)

// runBench: dlxbridge bench. The bench runs each side in a process of its
// own by running this binary again (see internal/bench).
func runBench(ctx context.Context, env *Env, args []string) int {
	return bench.Command(ctx, args, env.Stdout, env.Stderr, env.Getenv)
}
