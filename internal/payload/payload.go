// Package payload holds the one rule for showing a message body: as text
// or as base64. The quarantine's JSON output and the sidecar's quarantine
// page both follow it, so that they agree on every record.
package payload

import "unicode/utf8"

// IsText reports whether a payload is shown as text: valid UTF-8 without
// control characters other than whitespace. Anything else is shown as
// base64.
func IsText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, c := range b {
		if c < 0x20 && c != '\n' && c != '\r' && c != '\t' {
			return false
		}
	}
	return true
}
