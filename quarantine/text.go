package quarantine

// IsText reports whether a payload is shown as text (valid UTF-8 without
// control characters other than whitespace) rather than base64: the rule
// the JSON output follows, exported so that the quarantine page agrees.
func IsText(b []byte) bool { return isText(b) }
