package quarantine

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Patch repairs payloads before a replay: either an RFC 7386 JSON merge
// patch applied to each payload, or a replacement body. The result must
// pass the current schema before it is sent; the record stays open until
// the patched message is confirmed.
type Patch struct {
	// Merge is a JSON merge patch.
	Merge json.RawMessage
	// Replace is a whole new body (used when Merge is empty).
	Replace []byte
}

// Apply returns the patched body.
func (p *Patch) Apply(body []byte) ([]byte, error) {
	if len(p.Merge) == 0 {
		return append([]byte(nil), p.Replace...), nil
	}
	var doc, patch any
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("payload is not JSON: %w", err)
	}
	if err := json.Unmarshal(p.Merge, &patch); err != nil {
		return nil, fmt.Errorf("merge patch is not JSON: %w", err)
	}
	out, err := json.Marshal(mergePatch(doc, patch))
	if err != nil {
		return nil, errors.New("patched payload cannot be encoded")
	}
	return out, nil
}

// mergePatch is RFC 7386: objects merge key by key, null deletes, anything
// else replaces.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
			continue
		}
		t[k] = mergePatch(t[k], v)
	}
	return t
}
