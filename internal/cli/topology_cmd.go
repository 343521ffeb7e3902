package cli

import (
	"context"
	"fmt"
)

// runTopology: being built (issue 2).
func runTopology(ctx context.Context, env *Env, args []string) int {
	fmt.Fprintln(env.Stderr, "dlxbridge topology: not built yet")
	return ExitFail
}
