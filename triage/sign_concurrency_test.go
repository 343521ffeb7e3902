package triage

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/dlxbridge/dlxbridge/wire"
)

// Workers sign and verify at once with the pooled buffers and keyed
// HMACs, under two keys, with headers small and over the pooled buffer's
// bound: every result is the one computed alone, and a signature made
// under one key never verifies under the other.
func TestSignerConcurrentUseGivesTheSerialResults(t *testing.T) {
	t.Parallel()
	other, err := NewSigner([]byte("another-key-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	signers := []*Signer{testSigner, other}
	fields := []string{wire.HeaderAttempts, "dlxbridge-notes"}
	type job struct {
		s    *Signer
		sub  Subject
		h    table
		want string
	}
	var jobs []job
	for i := range 64 {
		s := signers[i%2]
		h := table{wire.HeaderAttempts: int64(i), "dlxbridge-notes": strings.Repeat("n", (i%8)*1024)}
		sub := Subject{Queue: "orders", MessageID: fmt.Sprint("m-", i), Body: []byte(strings.Repeat("b", i))}
		jobs = append(jobs, job{s, sub, h, s.Sign(sub, h, fields)})
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range 50 {
				j := jobs[(g*7+r)%len(jobs)]
				if got := j.s.Sign(j.sub, j.h, fields); got != j.want {
					t.Errorf("job %d: concurrent signature %q, alone %q", (g*7+r)%len(jobs), got, j.want)
					return
				}
				h := table{wire.HeaderSignature: j.want}
				for k, v := range j.h {
					h[k] = v
				}
				if !j.s.Verify(j.sub, h, fields).Valid {
					t.Errorf("a concurrent verify failed")
					return
				}
				wrong := signers[0]
				if j.s == wrong {
					wrong = signers[1]
				}
				if wrong.Verify(j.sub, h, fields).Valid {
					t.Errorf("a signature verified under another key")
					return
				}
			}
		}()
	}
	wg.Wait()
}
