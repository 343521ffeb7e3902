package brokertest

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"sync"
)

// A recorder stands between one test's clients and the broker: a TCP relay
// on a loopback port that passes every byte through unchanged and reads the
// frames clients send, noting the name of every queue and exchange they
// declare. Env.URL points at it, so whatever a test declares — through
// topology.Apply, a consumer, the CLI or a raw channel call — is known to
// the harness without asking the management API, which may be off.
type recorder struct {
	ln       net.Listener
	upstream string // host:port of the broker
	declared func(k kind, name string)

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

type kind byte

const (
	queue    kind = 'q'
	exchange kind = 'x'
)

func (k kind) String() string {
	if k == queue {
		return "queue"
	}
	return "exchange"
}

// startRecorder listens on a free loopback port and relays each connection
// to upstream, calling declared (from the relaying goroutines) for every
// queue.declare and exchange.declare that is not passive.
func startRecorder(upstream string, declared func(k kind, name string)) (*recorder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &recorder{ln: ln, upstream: upstream, declared: declared, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

// addr is the host:port clients dial.
func (r *recorder) addr() string { return r.ln.Addr().String() }

func (r *recorder) serve() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		if !r.track(c) {
			return
		}
		r.wg.Add(1)
		go r.relay(c)
	}
}

// track registers c so close can cut it; false once the recorder is closed.
func (r *recorder) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		_ = c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *recorder) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	_ = c.Close()
}

func (r *recorder) relay(client net.Conn) {
	defer r.wg.Done()
	defer r.untrack(client)
	server, err := net.DialTimeout("tcp", r.upstream, dialTimeout)
	if err != nil {
		return // the client sees its connection closed during the handshake
	}
	if !r.track(server) {
		return
	}
	defer r.untrack(server)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(client, server)
		// The broker hung up (or close cut it): so does the client.
		_ = client.Close()
	}()
	_ = scanFrames(server, client, r.declared)
	_ = server.Close()
	<-done
}

// close stops accepting, cuts every relayed connection and waits for the
// relaying goroutines to end.
func (r *recorder) close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	_ = r.ln.Close()
	r.wg.Wait()
}

// AMQP 0-9-1 framing: a client first sends the 8-byte protocol header, then
// frames of type(1) channel(2) size(4) payload(size) end(1).
const (
	protocolHeaderLen = 8
	frameHeaderLen    = 7
	frameMethod       = 1
	// methodPeek bounds what is read of a method frame to find a name: the
	// fields needed come first and are at most 2+2+2+(1+255)+(1+255)+1.
	methodPeek = 1024
)

// scanFrames copies the client's byte stream from src to dst unchanged and
// calls declared for every non-passive queue.declare or exchange.declare
// with a name. It returns when either side fails. It never holds more than
// one method's first bytes: bodies are streamed through.
func scanFrames(dst io.Writer, src io.Reader, declared func(k kind, name string)) error {
	in := bufio.NewReaderSize(src, 32<<10)
	out := bufio.NewWriterSize(dst, 32<<10)
	// Flush what was read before waiting for more, so nothing the client
	// sent sits in the relay.
	fill := func(p []byte) error {
		if in.Buffered() < len(p) {
			if err := out.Flush(); err != nil {
				return err
			}
		}
		if _, err := io.ReadFull(in, p); err != nil {
			return err
		}
		_, err := out.Write(p)
		return err
	}
	if err := fill(make([]byte, protocolHeaderLen)); err != nil {
		return err
	}
	var header [frameHeaderLen]byte
	peek := make([]byte, methodPeek)
	for {
		if err := fill(header[:]); err != nil {
			return err
		}
		rest := int64(binary.BigEndian.Uint32(header[3:])) + 1 // payload and frame end
		if header[0] == frameMethod {
			n := min(rest-1, methodPeek)
			if err := fill(peek[:n]); err != nil {
				return err
			}
			if k, name, ok := parseDeclare(peek[:n]); ok {
				declared(k, name)
			}
			rest -= n
		}
		if _, err := io.CopyN(out, in, rest); err != nil {
			return err
		}
	}
}

// parseDeclare reads a method payload and reports a non-passive
// queue.declare (class 50, method 10) or exchange.declare (40, 10) with a
// non-empty name.
func parseDeclare(p []byte) (kind, string, bool) {
	if len(p) < 6 {
		return 0, "", false
	}
	class, method := binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:])
	if method != 10 || (class != 50 && class != 40) {
		return 0, "", false
	}
	p = p[6:] // class, method, reserved-1 (ticket)
	name, p, ok := shortstr(p)
	if !ok || name == "" {
		return 0, "", false
	}
	k := queue
	if class == 40 {
		k = exchange
		if _, p, ok = shortstr(p); !ok { // exchange type
			return 0, "", false
		}
	}
	if len(p) < 1 || p[0]&1 != 0 { // passive: declares nothing
		return 0, "", false
	}
	return k, name, true
}

func shortstr(p []byte) (string, []byte, bool) {
	if len(p) < 1 || len(p) < 1+int(p[0]) {
		return "", nil, false
	}
	return string(p[1 : 1+p[0]]), p[1+p[0]:], true
}
