package amqpx

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
)

// headerFrame builds a content header frame whose headers table holds the
// encoded fields.
func headerFrame(fields []byte) []byte {
	payload := []byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0xA0, 0} // basic, body 2, content-type + headers
	payload = append(payload, 4, 'j', 's', 'o', 'n')
	payload = binary.BigEndian.AppendUint32(payload, uint32(len(fields)))
	payload = append(payload, fields...)
	f := append([]byte{frameHeader, 0, 1}, binary.BigEndian.AppendUint32(nil, uint32(len(payload)))...)
	return append(append(f, payload...), frameEnd)
}

func readAll(t *testing.T, in []byte) []byte {
	t.Helper()
	a, b := net.Pipe()
	go func() { _, _ = a.Write(in); _ = a.Close() }()
	out, err := io.ReadAll(newReadableConn(b))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestReadableConnRewritesUnsignedTypesOnly(t *testing.T) {
	t.Parallel()
	body := []byte{3, 0, 1, 0, 0, 0, 2, 'u', 'i', frameEnd} // a body frame "ui": passed through
	in := headerFrame([]byte("\x01au\xff\xff" + "\x01bF\x00\x00\x00\x07\x01ci\xff\xff\xff\xfe" + "\x01dA\x00\x00\x00\x03u\x00\x01"))
	want := headerFrame([]byte("\x01aI\x00\x00\xff\xff" + "\x01bF\x00\x00\x00\x0b\x01cl\x00\x00\x00\x00\xff\xff\xff\xfe" + "\x01dA\x00\x00\x00\x05I\x00\x00\x00\x01"))
	got := readAll(t, append(append([]byte(nil), in...), body...))
	if !bytes.Equal(got, append(want, body...)) {
		t.Fatalf("got  %q\nwant %q", got, append(want, body...))
	}
	// Nothing to rewrite, or a table that does not parse: unchanged.
	for _, fields := range []string{"\x01aS\x00\x00\x00\x02ui", "\x01au\xff", "\x01aZ\x00"} {
		in := headerFrame([]byte(fields))
		if got := readAll(t, in); !bytes.Equal(got, in) {
			t.Errorf("%q: got %q", fields, got)
		}
	}
}

func FuzzReadableProperties(f *testing.F) {
	f.Add(headerFrame([]byte("\x01au\xff\xff\x01dA\x00\x00\x00\x03u\x00\x01"))[7:])
	f.Add([]byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0xE0, 0, 200})
	f.Fuzz(func(t *testing.T, p []byte) {
		_, _ = readableProperties(nil, p) // must not panic
	})
}

// deliveryFrames is one delivery as the broker sends it: a method frame, a
// content header frame whose table carries a retry's headers (names with
// 'i' and 'u' in them, no unsigned values), and a 1 KB body frame.
func deliveryFrames() []byte {
	var fields []byte
	for _, kv := range [][2]string{{"dlxbridge-attempts-of-this-message", "1"}, {"dlxbridge-original-queue", "orders.work"},
		{"dlxbridge-first-failure-at", "2026-01-02T03:04:05.123456789Z"}, {"dlxbridge-signature", "v1.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJ"},
		{"version", "2"}, {"traceparent", "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"}} {
		fields = append(fields, byte(len(kv[0])))
		fields = append(fields, kv[0]...)
		fields = append(fields, 'S')
		fields = binary.BigEndian.AppendUint32(fields, uint32(len(kv[1])))
		fields = append(fields, kv[1]...)
	}
	method := []byte{1, 0, 1, 0, 0, 0, 40}
	method = append(method, make([]byte, 40)...)
	method = append(method, frameEnd)
	body := []byte{3, 0, 1, 0, 0, 4, 0}
	body = append(body, bytes.Repeat([]byte("x"), 1024)...)
	body = append(body, frameEnd)
	return append(append(method, headerFrame(fields)...), body...)
}

// A delivery whose header table needs no rewriting passes through byte for
// byte, also read in the small pieces a client's buffered reader asks for.
func TestReadableConnPassesUnchangedTablesThrough(t *testing.T) {
	t.Parallel()
	in := bytes.Repeat(deliveryFrames(), 3)
	if got := readAll(t, in); !bytes.Equal(got, in) {
		t.Fatalf("changed:\ngot  %q\nwant %q", got, in)
	}
}

// The reader reuses its buffers from frame to frame: frames that need a
// rewrite and frames that do not, one after the other and read a few bytes
// at a time, each come out as they should, not as the one before.
func TestReadableConnReusesNoBytesItStillOwes(t *testing.T) {
	t.Parallel()
	small := headerFrame([]byte("\x01au\x00\x07"))
	smallWant := headerFrame([]byte("\x01aI\x00\x00\x00\x07"))
	large := headerFrame([]byte("\x01bS\x00\x00\x00\x40" + strings.Repeat("i", 64) + "\x01ci\x00\x00\x00\x09"))
	largeWant := headerFrame([]byte("\x01bS\x00\x00\x00\x40" + strings.Repeat("i", 64) + "\x01cl\x00\x00\x00\x00\x00\x00\x00\x09"))
	one := deliveryFrames()
	var in, want []byte
	for _, f := range [][2][]byte{{large, largeWant}, {small, smallWant}, {one, one}, {small, smallWant}, {large, largeWant}, {one, one}} {
		in, want = append(in, f[0]...), append(want, f[1]...)
	}
	a, b := net.Pipe()
	go func() { _, _ = a.Write(in); _ = a.Close() }()
	r := bufio.NewReaderSize(newReadableConn(b), 16)
	var got []byte
	buf := make([]byte, 5)
	for {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

// BenchmarkReadableConn reads deliveries through the rewriting reader as
// amqp091-go does (a 4 KiB buffered reader, a frame's header, then its
// payload).
func BenchmarkReadableConn(b *testing.B) {
	one := deliveryFrames()
	stream := bytes.Repeat(one, 64)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	var hdr [7]byte
	payload := make([]byte, 4096)
	for range b.N {
		r := bufio.NewReaderSize(newReadableConn(&streamConn{Reader: bytes.NewReader(stream)}), 4096)
		for {
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				break
			}
			n := int(binary.BigEndian.Uint32(hdr[3:])) + 1
			if _, err := io.ReadFull(r, payload[:n]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// streamConn is a net.Conn that reads from a Reader.
type streamConn struct {
	net.Conn
	io.Reader
}

func (c *streamConn) Read(p []byte) (int, error) { return c.Reader.Read(p) }
