package triage

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/dlxbridge/dlxbridge/wire"
)

// TestSignConcurrent: many goroutines signing and verifying at once with
// one Signer (the pooled encoding and HMAC, the MAC summed into the pooled
// buffer) each get the signature a lone call gives, and the signatures
// they keep stay what they were while others are made: none shares a
// pooled buffer. Bodies over maxPooledEncoding take the unpooled path.
func TestSignConcurrent(t *testing.T) {
	t.Parallel()
	fields := SignedHeaders()
	type job struct {
		sub  Subject
		h    table
		want string
	}
	var jobs []job
	for i := range 64 {
		sub := Subject{Queue: workQueue, MessageID: fmt.Sprintf("m-%d", i), Body: bytes.Repeat([]byte{byte('a' + i%26)}, (i*997)%(3*maxPooledEncoding))}
		h := table{wire.HeaderAttempts: int64(i), wire.HeaderOriginalQueue: strings.Repeat("q", i), wire.HeaderNotes: fmt.Sprint(i)}
		jobs = append(jobs, job{sub, h, testSigner.Sign(sub, h, fields)})
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := range 16 {
		wg.Go(func() {
			var kept []string
			for r := range 200 {
				j := jobs[(g*7+r)%len(jobs)]
				sig := testSigner.Sign(j.sub, j.h, fields)
				kept = append(kept, sig)
				h := table{wire.HeaderSignature: sig}
				for k, v := range j.h {
					h[k] = v
				}
				if sig != j.want || !testSigner.Verify(j.sub, h, fields).Valid {
					errs <- fmt.Sprintf("goroutine %d: %s: signature %q, want %q", g, j.sub.MessageID, sig, j.want)
					return
				}
				other := jobs[(g*7+r+1)%len(jobs)]
				if testSigner.Verify(other.sub, h, fields).Valid {
					errs <- fmt.Sprintf("goroutine %d: %s's signature verified for %s", g, j.sub.MessageID, other.sub.MessageID)
					return
				}
			}
			for r, sig := range kept {
				if want := jobs[(g*7+r)%len(jobs)].want; sig != want {
					errs <- fmt.Sprintf("goroutine %d: a kept signature changed to %q from %q", g, sig, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestVerifyRefusesMisshapenSignatures: a signature one character short or
// long, padded, in the standard alphabet, with a line break or NUL in
// place of a character, or cut and padded back to length, is malformed or
// does not match; never valid.
func TestVerifyRefusesMisshapenSignatures(t *testing.T) {
	t.Parallel()
	fields := SignedHeaders()
	h := table{wire.HeaderAttempts: int64(2), wire.HeaderOriginalQueue: "orders"}
	sig := testSigner.Sign(testSubject, h, fields)
	body := sig[len(sigPrefix):]
	raw, _ := base64.RawURLEncoding.DecodeString(body)
	std := base64.StdEncoding.EncodeToString(raw)
	cases := map[string]string{
		"one short":       sig[:len(sig)-1],
		"one long":        sig + "A",
		"padded":          sig + "=",
		"padded in place": sig[:len(sig)-1] + "=",
		"std alphabet":    sigPrefix + std[:len(body)],
		"line break":      sig[:20] + "\n" + sig[21:],
		"carriage return": sig[:len(sig)-1] + "\r",
		"nul":             sig[:10] + "\x00" + sig[11:],
		"space":           sig[:10] + " " + sig[11:],
		"empty":           "",
		"prefix only":     sigPrefix,
		"placeholder":     testSigner.Placeholder(),
		"another prefix":  "v2:" + body,
		"short mac":       sigPrefix + base64.RawURLEncoding.EncodeToString(raw[:31]) + "AA",
		"long mac":        sigPrefix + base64.RawURLEncoding.EncodeToString(append(raw, 0))[:len(body)],
		"non-ascii":       sig[:len(sig)-2] + "é",
	}
	for name, s := range cases {
		if s == sig {
			continue // the standard alphabet may spell it alike
		}
		c := table{wire.HeaderSignature: s}
		for k, v := range h {
			c[k] = v
		}
		if v := testSigner.Verify(testSubject, c, fields); v.Valid || v.Problem == "" {
			t.Errorf("%s (%q): %+v", name, s, v)
		}
	}
	ok := table{wire.HeaderSignature: sig}
	for k, v := range h {
		ok[k] = v
	}
	if !testSigner.Verify(testSubject, ok, fields).Valid {
		t.Fatal("the signature itself does not verify")
	}
}
