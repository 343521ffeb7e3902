package amqpx

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
)

// RabbitMQ accepts, and delivers as it received them, two AMQP 0-9-1 field
// types that amqp091-go v1.10 cannot read: 'u' (unsigned 16-bit) and 'i'
// (unsigned 32-bit). Any client but a Go one can set them in a header. On
// such a header, at any depth, amqp091-go fails to parse the content
// header frame and closes the whole connection ("invalid field or value
// inside of a frame"): one message would close a consumer's connection on
// every delivery, requeueing everything in flight on it each time.
//
// readableConn stands between the client and the socket and rewrites, in
// content header frames only, 'u' into 'I' (int32) and 'i' into 'l'
// (int64): the same value in a wider signed type the client reads (and
// writes back when the message is republished). Other frames pass through
// unchanged and are streamed, not buffered. A header that does not parse
// is passed through as it is (the client then fails as it would have).
type readableConn struct {
	net.Conn
	in   *bufio.Reader
	out  []byte // a frame's bytes not yet returned: its header, or a whole content header frame
	rest int64  // bytes of a frame passed through, still to return
	// Buffers reused from frame to frame (out points into one of them
	// until it is returned, and next is called only once it is): every
	// delivery has a content header frame, and most need no rewriting.
	head  [frameHeaderLen]byte
	frame []byte // a content header frame as read
	fixed []byte // a rewritten one
}

func newReadableConn(c net.Conn) net.Conn {
	return &readableConn{Conn: c, in: bufio.NewReaderSize(c, 32<<10)}
}

// Frame layout: type(1) channel(2) size(4) payload(size) end(1).
const (
	frameHeaderLen = 7
	frameHeader    = 2
	frameEnd       = 0xCE
	// maxRewrite bounds the content header frames that are read whole to
	// be rewritten; one over it (beyond any frame_max the bridge
	// negotiates) is passed through.
	maxRewrite = 1 << 20
)

func (c *readableConn) Read(p []byte) (int, error) {
	for len(c.out) == 0 && c.rest == 0 {
		if err := c.next(); err != nil {
			return 0, err
		}
	}
	if len(c.out) > 0 {
		n := copy(p, c.out)
		c.out = c.out[n:]
		return n, nil
	}
	n, err := c.in.Read(p[:min(int64(len(p)), c.rest)])
	c.rest -= int64(n)
	return n, err
}

// next reads the next frame's header and, for a content header frame, the
// whole frame, rewritten if it needs to be.
func (c *readableConn) next() error {
	h := c.head[:]
	if _, err := io.ReadFull(c.in, h); err != nil {
		return err
	}
	size := int64(binary.BigEndian.Uint32(h[3:]))
	if h[0] != frameHeader || size > maxRewrite {
		c.out = h
		c.rest = size + 1 // the payload and the frame end
		return nil
	}
	n := frameHeaderLen + int(size) + 1
	if cap(c.frame) < n {
		c.frame = make([]byte, n)
	}
	frame := c.frame[:n]
	copy(frame, h)
	if _, err := io.ReadFull(c.in, frame[frameHeaderLen:]); err != nil {
		return err
	}
	payload := frame[frameHeaderLen : frameHeaderLen+size]
	fixed, ok := readableProperties(c.fixed[:0], payload)
	c.fixed = fixed // its capacity, for the next frame
	if !ok {
		c.out = frame
		return nil
	}
	// The frame as read is spent (its payload is in fixed, rewritten):
	// the rewritten frame takes its buffer.
	out := append(append(append(c.frame[:0], h...), fixed...), frameEnd)
	binary.BigEndian.PutUint32(out[3:], uint32(len(fixed)))
	c.frame, c.out = out, out
	return nil
}

// readableProperties appends to dst the content header payload p (class(2)
// weight(2) body size(8) flags(2), then content-type and content-encoding,
// short strings, and the headers table, if their flags are set) with its
// header table rewritten. ok is false when nothing needed rewriting or it
// does not parse: p is then to be passed on as it is, and what is returned
// is dst emptied (grown, perhaps: the caller may keep it as scratch).
func readableProperties(dst, p []byte) ([]byte, bool) {
	const (
		flagContentType     = 0x8000
		flagContentEncoding = 0x4000
		flagHeaders         = 0x2000
	)
	if len(p) < 14 {
		return dst[:0], false
	}
	flags := binary.BigEndian.Uint16(p[12:])
	if flags&flagHeaders == 0 {
		return dst[:0], false
	}
	pos := 14
	for _, f := range []uint16{flagContentType, flagContentEncoding} {
		if flags&f != 0 {
			if pos >= len(p) {
				return dst[:0], false
			}
			pos += 1 + int(p[pos])
		}
	}
	if pos > len(p) || !hasUnsigned(p[pos:]) {
		return dst[:0], false
	}
	out := append(dst[:0], p[:pos]...)
	grown, n, ok := readableTable(out, p[pos:])
	if !ok {
		return out[:0], false
	}
	if len(grown) == pos+n {
		// A rewrite widens every value it touches: the same length means
		// the 'u' and 'i' bytes were names or strings, not type tags.
		return grown[:0], false
	}
	out = grown
	return append(out, p[pos+n:]...), true
}

// hasUnsigned is a quick check for the type tags (it may report bytes that
// are no tags, never misses one).
func hasUnsigned(p []byte) bool {
	for _, b := range p {
		if b == 'u' || b == 'i' {
			return true
		}
	}
	return false
}

// readableTable appends the field table at the start of p (length-prefixed)
// to dst, rewritten, and returns how many bytes of p it read.
func readableTable(dst, p []byte) ([]byte, int, bool) {
	if len(p) < 4 {
		return nil, 0, false
	}
	size := int(binary.BigEndian.Uint32(p))
	if size > len(p)-4 {
		return nil, 0, false
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	fields := p[4 : 4+size]
	for len(fields) > 0 {
		k := 1 + int(fields[0])
		if k > len(fields) {
			return nil, 0, false
		}
		dst = append(dst, fields[:k]...)
		var n int
		var ok bool
		if dst, n, ok = readableValue(dst, fields[k:]); !ok {
			return nil, 0, false
		}
		fields = fields[k+n:]
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst, 4 + size, true
}

// fixedSize is the value size of each fixed-size type both sides read.
var fixedSize = map[byte]int{'t': 1, 'b': 1, 'B': 1, 's': 2, 'I': 4, 'f': 4, 'D': 5, 'l': 8, 'd': 8, 'T': 8, 'V': 0}

// readableValue appends the tagged field value at the start of p to dst,
// rewritten, and returns how many bytes of p it read.
func readableValue(dst, p []byte) ([]byte, int, bool) {
	if len(p) < 1 {
		return nil, 0, false
	}
	tag, v := p[0], p[1:]
	if n, ok := fixedSize[tag]; ok {
		if n > len(v) {
			return nil, 0, false
		}
		return append(dst, p[:1+n]...), 1 + n, true
	}
	switch tag {
	case 'u':
		if len(v) < 2 {
			return nil, 0, false
		}
		return binary.BigEndian.AppendUint32(append(dst, 'I'), uint32(binary.BigEndian.Uint16(v))), 3, true
	case 'i':
		if len(v) < 4 {
			return nil, 0, false
		}
		return binary.BigEndian.AppendUint64(append(dst, 'l'), uint64(binary.BigEndian.Uint32(v))), 5, true
	case 'S', 'x':
		if len(v) < 4 || int(binary.BigEndian.Uint32(v)) > len(v)-4 {
			return nil, 0, false
		}
		n := 1 + 4 + int(binary.BigEndian.Uint32(v))
		return append(dst, p[:n]...), n, true
	case 'F':
		dst, n, ok := readableTable(append(dst, 'F'), v)
		return dst, 1 + n, ok
	case 'A':
		if len(v) < 4 || int(binary.BigEndian.Uint32(v)) > len(v)-4 {
			return nil, 0, false
		}
		size := int(binary.BigEndian.Uint32(v))
		dst = append(dst, 'A', 0, 0, 0, 0)
		start := len(dst) - 4
		for elems := v[4 : 4+size]; len(elems) > 0; {
			var n int
			var ok bool
			if dst, n, ok = readableValue(dst, elems); !ok {
				return nil, 0, false
			}
			elems = elems[n:]
		}
		binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
		return dst, 1 + 4 + size, true
	}
	return nil, 0, false
}
