package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/dlxbridge/dlxbridge/triage"
)

// A status outside 100–599 is no HTTP answer (RFC 9110 gives it no class,
// and forward.status cannot name it): a broken endpoint or proxy in
// between, not a bad message. Quarantining would park every message the
// queue sees while it lasts; it is retried, as a reset connection is.
func TestForwardOddStatusCodesAreTransient(t *testing.T) {
	t.Parallel()
	for _, code := range []int{600, 799, 999} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(code)
			}))
			defer srv.Close()
			err := forwarder(t, srv.URL, 1).Handle(context.Background(), message())
			if err == nil {
				t.Fatal("got nil (ack), want an error")
			}
			if class, _ := triage.Classify(err); class != triage.ClassTransient {
				t.Errorf("status %d classified %s, want %s (%v)", code, class, triage.ClassTransient, err)
			}
		})
	}
}
