package quarantine

import (
	"sort"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultFrameSize is the broker's default frame_max (3.x and 4.x). A
// header table must fit one frame with the other properties; a larger one
// makes the broker close the whole connection (FRAME_ERROR).
const DefaultFrameSize = 131072

// frameMargin leaves room in a frame for the other properties (message id,
// type, correlation id, ... each at most 255 bytes) and the frame overhead.
const frameMargin = 4096

// HeaderBudget is how many bytes of encoded headers fit a content header
// frame of frameSize (0 means DefaultFrameSize).
func HeaderBudget(frameSize int) int {
	if frameSize <= 0 {
		frameSize = DefaultFrameSize
	}
	return max(frameSize-frameMargin, 1024)
}

// FitHeaders drops headers from h, largest first, until its AMQP encoding is
// at most budget bytes. Headers for which keep returns true are never
// dropped. It returns the names it dropped, in order.
func FitHeaders(h amqp.Table, budget int, keep func(name string) bool) []string {
	size := EncodedSize(h)
	if size <= budget {
		return nil
	}
	type field struct {
		name string
		size int
	}
	var candidates []field
	for k, v := range h {
		if !keep(k) {
			candidates = append(candidates, field{k, fieldSize(k, v)})
		}
	}
	sort.Slice(candidates, func(i, j int) bool {
		if candidates[i].size != candidates[j].size {
			return candidates[i].size > candidates[j].size
		}
		return candidates[i].name < candidates[j].name
	})
	var dropped []string
	for _, f := range candidates {
		if size <= budget {
			break
		}
		delete(h, f.name)
		size -= f.size
		dropped = append(dropped, f.name)
	}
	return dropped
}

// EncodedSize is the size of v in AMQP 0-9-1 field-table encoding, as
// amqp091-go v1.10 writes it (write.go: writeTable, writeField): a table is
// a 4-byte length and, per field, a short-string key, a type tag and the
// value; arrays are a 4-byte length and tagged values.
func EncodedSize(v any) int {
	switch x := v.(type) {
	case amqp.Table:
		return tableSize(x)
	case map[string]any:
		return tableSize(x)
	}
	return valueSize(v)
}

func tableSize(t map[string]any) int {
	n := 4
	for k, v := range t {
		n += fieldSize(k, v)
	}
	return n
}

// fieldSize: key (1-byte length + bytes), type tag, value.
func fieldSize(k string, v any) int { return 1 + len(k) + 1 + valueSize(v) }

func valueSize(v any) int {
	switch x := v.(type) {
	case nil:
		return 0
	case bool, int8, uint8:
		return 1
	case int16:
		return 2
	case int, int32, float32: // amqp091-go writes an int as a 32-bit 'I'
		return 4
	case int64, float64, time.Time:
		return 8
	case amqp.Decimal:
		return 5
	case string:
		return 4 + len(x)
	case []byte:
		return 4 + len(x)
	case amqp.Table:
		return tableSize(x)
	case map[string]any:
		return tableSize(x)
	case []any:
		n := 4
		for _, e := range x {
			n += 1 + valueSize(e)
		}
		return n
	}
	return 16 // a type amqp091-go refuses to encode (ErrFieldType); count it small
}
