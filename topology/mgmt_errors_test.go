package topology_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/topology"
)

// A management API that refuses a read with a body of its own (a proxy's
// error page, say) is quoted in the error, and from there in delete's,
// plan's and verify's reports on an operator's terminal: only a bounded,
// escaped part of it, so that it can neither fill the report nor set the
// terminal's title, clear its screen or fake a line.
func TestManagementErrorQuotesOnlyAPrintablePartOfTheBody(t *testing.T) {
	t.Parallel()
	hostile := "\x1b]0;pwned\x07\x1b[2J\u202e<html>" + strings.Repeat("A", 100_000) + "</html>"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		_, _ = w.Write([]byte(hostile))
	}))
	defer srv.Close()
	m, err := topology.NewManagement(srv.URL, "amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Queue(context.Background(), "q")
	if err == nil {
		t.Fatal("a 502 read as a queue")
	}
	msg := err.Error()
	if strings.ContainsAny(msg, "\x1b\x07\u202e") {
		t.Errorf("the error carries the body's control characters: %q", msg[:min(len(msg), 200)])
	}
	if len(msg) > 2000 {
		t.Errorf("the error quotes %d bytes of the body", len(msg))
	}
	if !strings.Contains(msg, "502") || !strings.Contains(msg, `\x1b]0;pwned`) {
		t.Errorf("the error %q does not show the status and the start of the body, escaped", msg[:min(len(msg), 200)])
	}
}
