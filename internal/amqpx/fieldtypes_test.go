package amqpx

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
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
		_, _ = readableProperties(p) // must not panic
	})
}
