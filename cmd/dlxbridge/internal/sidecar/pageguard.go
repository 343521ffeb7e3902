package sidecar

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// MinTokenBytes is the shortest operator token `dlxbridge run` accepts.
const MinTokenBytes = 16

// hostAllowed reports whether a request's Host names the address the page
// was reached on, or one of allowed. A DNS-rebinding page reaches the
// sidecar under the attacker's own name, which no check of the client's
// address can tell from a local browser: the Host header is what differs.
// An IP literal of the local address, with its port, is the page's own
// name; on a loopback address so are localhost, 127.0.0.1 and [::1].
// Entries of allowed are host:port, or a bare host for any port.
func hostAllowed(r *http.Request, allowed []string) bool {
	host, port := splitHost(r.Host)
	if host == "" {
		return false
	}
	for _, a := range allowed {
		ah, ap := splitHost(a)
		if strings.EqualFold(ah, host) && (ap == "" || ap == port) {
			return true
		}
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	lh, lp, err := net.SplitHostPort(local.String())
	if err != nil || lp != port {
		return false
	}
	lip := net.ParseIP(lh)
	if ip := net.ParseIP(host); ip != nil {
		return lip != nil && (ip.Equal(lip) || lip.IsLoopback() && ip.IsLoopback())
	}
	return lip != nil && lip.IsLoopback() && strings.EqualFold(host, "localhost")
}

// splitHost splits host[:port], brackets removed; the port is "" when
// absent. A request's Host without a port matches only an allowed-list
// entry written without one.
func splitHost(hp string) (host, port string) {
	if h, p, err := net.SplitHostPort(hp); err == nil {
		return h, p
	}
	return strings.TrimSuffix(strings.TrimPrefix(hp, "["), "]"), ""
}

// crossOrigin refuses a browser's POST that another origin's page made
// (its Sec-Fetch-Site, or else its Origin, says so); a client without
// those headers (curl, a script) is not a browser another site can drive.
var crossOrigin http.CrossOriginProtection

// guarded refuses a request whose Host the page does not answer to, and a
// form another site's page had the browser send: such a form cannot know
// the token or a confirmation, but its guesses would use up the tries of
// the operator's own address (every local browser is 127.0.0.1) and lock
// them out.
func (p *Page) guarded(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !hostAllowed(r, p.AllowedHosts) {
			p.log().Warn("quarantine page: refused a request for another host", "host", r.Host, "remote", r.RemoteAddr)
			http.Error(w, "misdirected request: this page answers only to the address it listens on (and localhost on loopback); add the name you use to run.allowed_hosts", http.StatusMisdirectedRequest)
			return
		}
		if err := crossOrigin.Check(r); err != nil {
			http.Error(w, "forbidden: a cross-origin request (a form another site's page sent): open the quarantine page itself and act there", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}

// tokenMatches compares the digests of got and want in constant time, so
// that neither the token's bytes nor its length show in the timing.
func tokenMatches(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// Failed authorizations are limited per client (see clientKey): a bucket of
// failBurst tries, refilled one per failRefill. At most failClients
// clients are tracked; past that, the new ones share one bucket, so a
// flood of addresses slows down together rather than growing the map.
const (
	failBurst   = 5
	failRefill  = 10 * time.Second
	failClients = 4096
	// failLogEvery bounds the WARN lines about refused tokens.
	failLogEvery = 10 * time.Second
)

type failBucket struct {
	tokens float64
	at     time.Time
}

// failLimiter slows down guessing of the operator token.
type failLimiter struct {
	mu       sync.Mutex
	clients  map[string]*failBucket
	shared   failBucket
	lastLog  time.Time
	unlogged int
}

// clientKey is the client a bucket belongs to: its IPv4 address, or the
// /64 of its IPv6 address. One host is routinely given a whole /64 and
// may use any address in it, so keying by the address would give it 2^64
// buckets to rotate through. (An IPv4-mapped address is its IPv4 one.)
func clientKey(remote string) string {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is4() {
		return ip.String()
	}
	return netip.PrefixFrom(ip, 64).Masked().String()
}

// bucket returns the client's bucket refilled to now. Call with mu held.
func (l *failLimiter) bucket(client string, now time.Time) *failBucket {
	if l.clients == nil {
		l.clients = map[string]*failBucket{}
	}
	b, ok := l.clients[client]
	if !ok {
		if len(l.clients) >= failClients {
			l.sweep(now)
		}
		if len(l.clients) >= failClients {
			b = &l.shared
		} else {
			b = &failBucket{tokens: failBurst, at: now}
			l.clients[client] = b
		}
	}
	if b.at.IsZero() {
		b.tokens, b.at = failBurst, now
	}
	b.tokens = min(failBurst, b.tokens+float64(now.Sub(b.at))/float64(failRefill))
	b.at = now
	return b
}

// sweep forgets the clients whose bucket is full again.
func (l *failLimiter) sweep(now time.Time) {
	for k, b := range l.clients {
		if b.tokens+float64(now.Sub(b.at))/float64(failRefill) >= failBurst {
			delete(l.clients, k)
		}
	}
}

// allow reports whether client may try now, and if not, how long until it
// may.
func (l *failLimiter) allow(client string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(client, now)
	if b.tokens >= 1 {
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) * float64(failRefill))
}

// failed takes a try from client's bucket, and reports whether to log now
// and how many refusals went unlogged before.
func (l *failLimiter) failed(client string, now time.Time) (logNow bool, unlogged int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(client, now)
	b.tokens = max(0, b.tokens-1)
	if now.Sub(l.lastLog) < failLogEvery {
		l.unlogged++
		return false, 0
	}
	l.lastLog, unlogged, l.unlogged = now, l.unlogged, 0
	return true, unlogged
}

// A dry run on the page hands out a confirmation instead of the token:
// a random id, bound server-side to the dry run's action, selection and
// records, usable once, for confirmTTL. At most maxConfirmations wait at
// a time; the oldest goes first.
const (
	confirmTTL       = 10 * time.Minute
	maxConfirmations = 256
)

type pending struct {
	kind    string
	sel     selection
	ids     []string
	expires time.Time
}

type confirmations struct {
	mu    sync.Mutex
	byID  map[string]*pending
	order []string // ids, oldest first
}

// issue stores a dry run and returns its confirmation id.
func (c *confirmations) issue(kind string, sel selection, ids []string, now time.Time) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byID == nil {
		c.byID = map[string]*pending{}
	}
	for len(c.order) > 0 && (len(c.byID) >= maxConfirmations || c.byID[c.order[0]] == nil || now.After(c.byID[c.order[0]].expires)) {
		delete(c.byID, c.order[0])
		c.order = c.order[1:]
	}
	if len(c.order) > 2*maxConfirmations { // taken ones linger behind a live one
		live := c.order[:0]
		for _, k := range c.order {
			if c.byID[k] != nil {
				live = append(live, k)
			}
		}
		c.order = live
	}
	c.byID[id] = &pending{kind: kind, sel: sel, ids: append([]string(nil), ids...), expires: now.Add(confirmTTL)}
	c.order = append(c.order, id)
	return id
}

// has reports whether id is a live confirmation for kind, and leaves it
// for take.
func (c *confirmations) has(id, kind string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	pd, ok := c.byID[id]
	return ok && pd.kind == kind && !now.After(pd.expires)
}

// take returns the dry run of id for kind and forgets it: a confirmation
// is good for one use, and only for the action it was issued for.
func (c *confirmations) take(id, kind string, now time.Time) (*pending, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pd, ok := c.byID[id]
	if !ok {
		return nil, false
	}
	delete(c.byID, id)
	if pd.kind != kind || now.After(pd.expires) {
		return nil, false
	}
	return pd, true
}
