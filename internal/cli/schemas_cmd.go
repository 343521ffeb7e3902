package cli

import (
	"context"
	"fmt"
)

// runSchemas: being built (issue 3).
func runSchemas(ctx context.Context, env *Env, args []string) int {
	fmt.Fprintln(env.Stderr, "dlxbridge schemas: not built yet")
	return ExitFail
}
