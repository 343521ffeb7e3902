package topology

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

// A broker.management_url may name the management API of several nodes,
// comma separated, as the AMQP URL may. The Management then gets a Client
// whose transport sends each request to the node that last answered and,
// when that one does not (connection refused, reset, timed out), to the
// next: BaseURL stays the first node's, and the requests' paths and
// credentials are the same on every node of a cluster.

// mgmtNodeTimeout bounds one request to one node.
const mgmtNodeTimeout = 10 * time.Second

// nodesTransport rewrites each request from bases[0] to the node it tries.
type nodesTransport struct {
	bases []*url.URL
	cur   atomic.Int32
	next  http.RoundTripper
}

func newNodesClient(bases []*url.URL) *http.Client {
	// Each try is bounded on its own, so that a node cut off (which
	// answers nothing) leaves the others time.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: mgmtNodeTimeout / 2, KeepAlive: 30 * time.Second}).DialContext
	tr.ResponseHeaderTimeout = mgmtNodeTimeout
	t := &nodesTransport{bases: bases, next: tr}
	// Every node may take its full timeout before the last answers.
	return &http.Client{Transport: t, Timeout: time.Duration(len(bases)) * mgmtNodeTimeout}
}

func (t *nodesTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rest, ok := strings.CutPrefix(req.URL.Path, t.bases[0].Path)
	rawRest, rawOK := strings.CutPrefix(req.URL.EscapedPath(), t.bases[0].EscapedPath())
	if !ok || !rawOK || req.URL.Host != t.bases[0].Host {
		return t.next.RoundTrip(req) // not a request to the API
	}
	first := int(t.cur.Load())
	var errs []error
	for k := range t.bases {
		i := (first + k) % len(t.bases)
		r := req.Clone(req.Context())
		r.URL.Scheme, r.URL.Host, r.Host = t.bases[i].Scheme, t.bases[i].Host, ""
		// The vhost "/" is "%2F" in the path: keep the escaping.
		r.URL.Path, r.URL.RawPath = t.bases[i].Path+rest, t.bases[i].EscapedPath()+rawRest
		resp, err := t.next.RoundTrip(r)
		if err == nil {
			t.cur.Store(int32(i))
			return resp, nil
		}
		// Its text names at most the node's host and port.
		errs = append(errs, fmt.Errorf("%s: %w", t.bases[i].Host, err))
		if req.Context().Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("no management API of the %d nodes answered: %w", len(t.bases), errors.Join(errs...))
}
