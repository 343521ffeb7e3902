package consumer

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Every connection, channel, worker and handler goroutine the runtime starts
// must be gone once the tests (and their cleanups) are done.
func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		os.Exit(crashChild()) // a consumer process for the crash-loop test
	}
	if os.Getenv(redriveChildEnv) != "" {
		os.Exit(redriveChild()) // a runtime process for the redrive kill test
	}
	goleak.VerifyTestMain(m,
		// testcontainers' reaper, when the tests start their own broker.
		goleak.IgnoreAnyFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
	)
}
