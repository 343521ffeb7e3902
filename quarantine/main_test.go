package quarantine

import (
	"testing"

	"go.uber.org/goleak"
)

// Every stream reader, cancel watcher and keeper goroutine a replay, a
// redrive or an inspection starts must be gone once the tests (and their
// cleanups) are done.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
