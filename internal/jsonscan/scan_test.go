package jsonscan

import (
	"math/rand/v2"
	"testing"
)

// plain is plainRun's definition, a byte at a time.
func plain(c byte) bool { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\' }

// checkPlainRun holds plainRun(data, p) to its definition: every byte it
// skips is plain, and it stops at the first byte that is not, or within
// the last eight.
func checkPlainRun(t *testing.T, data []byte, p int) {
	t.Helper()
	q := plainRun(data, p)
	for i := p; i < q; i++ {
		if !plain(data[i]) {
			t.Fatalf("plainRun(%q, %d) = %d skips byte %#x at %d", data, p, q, data[i], i)
		}
	}
	if q < len(data) && plain(data[q]) && len(data)-q >= 8 {
		t.Fatalf("plainRun(%q, %d) = %d stops at plain byte %q with %d bytes left", data, p, q, data[q], len(data)-q)
	}
	if q > len(data) || q < p {
		t.Fatalf("plainRun(%q, %d) = %d", data, p, q)
	}
}

// TestPlainRun puts every byte value at every offset of a run of each
// plain byte (those next to the special ones among them), and random
// mixes, and checks plainRun against its definition.
func TestPlainRun(t *testing.T) {
	t.Parallel()
	fillers := []byte{' ', '!', '#', '[', ']', 'a', 'x', 0x7f, '/', '0'}
	for _, fill := range fillers {
		for n := 0; n <= 24; n++ {
			for k := 0; k < n; k++ {
				for c := 0; c < 256; c++ {
					data := make([]byte, n)
					for i := range data {
						data[i] = fill
					}
					data[k] = byte(c)
					for p := 0; p <= min(n, 9); p++ {
						checkPlainRun(t, data, p)
					}
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(3, 5))
	alphabet := []byte{'a', ' ', '"', '\\', 0x1f, 0x00, 0x80, 0xff, 0x7f, 0x21, 0x5d, 0xc3, 0xa9, 0x20}
	for range 20000 {
		data := make([]byte, rng.IntN(40))
		for i := range data {
			if rng.IntN(6) == 0 {
				data[i] = alphabet[rng.IntN(len(alphabet))]
			} else {
				data[i] = byte(0x20 + rng.IntN(0x60))
			}
		}
		checkPlainRun(t, data, rng.IntN(len(data)+1))
	}
}

func FuzzPlainRun(f *testing.F) {
	f.Add([]byte(`abcdefgh"ijklmnop`), uint8(0))
	f.Add([]byte("abcdefgh\x1fijklmnop\\"), uint8(3))
	f.Add([]byte("Hauptstraße 1, 3. OG, Berlin"), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, p uint8) {
		checkPlainRun(t, data, int(p)%(len(data)+1))
	})
}
