package topology_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every connection, channel and goroutine that plan, apply, verify and
// delete start must be gone once the tests (and their cleanups) are done.
// An idle keep-alive connection of an HTTP client's pool is not one: the
// management API's clients keep them for the next request.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	)
}
