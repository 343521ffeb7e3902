package brokertest

import (
	"bytes"
	"net"
)

// RewritingDial is an amqp.Config Dial whose connections turn, in what the
// client writes, each old byte string of pairs into its new one (same
// length): the way a test sends field types that amqp091-go cannot encode
// but other clients, and the broker, accept ('u' and 'i'). The broker
// behind it is the real one.
func RewritingDial(pairs ...[2][]byte) func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, dialTimeout)
		if err != nil {
			return nil, err
		}
		return &rewritingConn{Conn: c, pairs: pairs}, nil
	}
}

type rewritingConn struct {
	net.Conn
	pairs [][2][]byte
}

func (c *rewritingConn) Write(p []byte) (int, error) {
	q := p
	for _, r := range c.pairs {
		q = bytes.ReplaceAll(q, r[0], r[1])
	}
	if _, err := c.Conn.Write(q); err != nil {
		return 0, err
	}
	return len(p), nil
}
