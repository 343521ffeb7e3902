package amqpx_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
)

// tlsProxy terminates TLS for 127.0.0.1 with a fresh self-signed
// certificate and relays to upstream, replacing old with new in what
// clients send. It returns its address and the CA file clients trust.
func tlsProxy(t *testing.T, upstream string, old, new []byte) (addr, caFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dlxbridge test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, s)
				_ = c.Close()
			}()
			go func() {
				defer wg.Done()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, werr := s.Write(bytes.ReplaceAll(buf[:n], old, new)); werr != nil {
							return
						}
					}
					if err != nil {
						_ = s.Close()
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), caFile
}

// Over amqps too, a header of a type amqp091-go cannot read (here 'u', an
// unsigned short, which RabbitMQ accepts and delivers) reaches the reader as
// an int32 instead of closing its connection.
func TestDialOverTLSReadsUnsignedHeaderTypes(t *testing.T) {
	t.Parallel()
	env := brokertest.Require(t)
	q := env.Name("q")
	if _, err := env.Channel("setup").QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	plain, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	addr, ca := tlsProxy(t, plain.Host, []byte("top-u16s"), []byte("top-u16u"))
	secure := *plain
	secure.Scheme, secure.Host, secure.RawQuery = "amqps", addr, "cacertfile="+url.QueryEscape(ca)

	conn, err := amqpx.Dial(secure.String(), env.Prefix+"/tls")
	if err != nil {
		t.Fatalf("dial over TLS: %v", err)
	}
	defer conn.Close()
	pub, err := amqpx.NewPublisher(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, "", q, amqp.Publishing{Headers: amqp.Table{"top-u16": int16(-1)}, Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := ch.Get(q, true)
	if err != nil || !ok {
		t.Fatalf("get: ok %v, err %v", ok, err)
	}
	if got := d.Headers["top-u16"]; got != int32(65535) {
		t.Fatalf("top-u16 = %#v, want int32(65535)", got)
	}
}
