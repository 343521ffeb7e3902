package brokertest

import (
	"io"
	"net"
	"sync"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// Proxy is a fault injector for failover tests: a TCP relay on a loopback
// port of its own that stands for one node of a cluster, in front of the
// test's broker. Down takes the "node" down (it stops listening and cuts
// every connection through it, as a stopped node's socket would close),
// Up brings it back on the same port. It passes bytes unchanged; it is not
// a broker mock: everything behind it is the real broker. It is closed
// when the test ends.
type Proxy struct {
	// URL is the AMQP URL that leads through the proxy (the test's
	// credentials and vhost).
	URL string
	// Addr is its host:port, what the bridge logs as the node's.
	Addr string

	upstream string
	mu       sync.Mutex
	ln       net.Listener // nil while down
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

// Proxy starts a proxy to e's broker, through e's recording relay where
// there is one, so what a test declares through it is cleaned up too.
func (e *Env) Proxy() *Proxy {
	e.T.Helper()
	u, err := amqpx.ParseURL("AMQP URL", e.URL)
	if err != nil {
		e.T.Fatal(err)
	}
	if u.Scheme != "amqp" {
		e.T.Skip("a proxy needs a plain amqp:// broker URL")
	}
	port := u.Port()
	if port == "" {
		port = "5672"
	}
	p := &Proxy{upstream: net.JoinHostPort(u.Hostname(), port), conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.T.Fatal(err)
	}
	p.Addr = ln.Addr().String()
	u.Host = p.Addr
	p.URL = u.String()
	p.ln = ln
	p.serve(ln)
	e.T.Cleanup(func() {
		p.Down()
		p.wg.Wait()
	})
	return p
}

// Down stops listening and cuts every connection through the proxy: a
// dial then gets connection refused, and a client already connected sees
// its socket closed. It returns once every relayed connection is closed.
func (p *Proxy) Down() {
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
}

// Up listens again on the same port. It fails (returns the error) only if
// another process took the port meanwhile.
func (p *Proxy) Up() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return nil
	}
	var ln net.Listener
	var err error
	// The port was closed a moment ago; the kernel may take a moment to
	// free it.
	for range 50 {
		if ln, err = net.Listen("tcp", p.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	p.ln = ln
	p.serve(ln)
	return nil
}

// serve accepts on ln until it is closed.
func (p *Proxy) serve(ln net.Listener) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !p.track(ln, c) {
				return
			}
			p.wg.Add(1)
			go p.relay(ln, c)
		}
	}()
}

// track registers c, unless the listener it came from was taken down.
func (p *Proxy) track(ln net.Listener, c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != ln {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) relay(ln net.Listener, client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	server, err := net.DialTimeout("tcp", p.upstream, dialTimeout)
	if err != nil {
		return
	}
	if !p.track(ln, server) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(client, server)
		_ = client.Close()
	}()
	_, _ = io.Copy(server, client)
	_ = server.Close()
	<-done
}
