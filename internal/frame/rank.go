package frame

import (
	"strings"

	"github.com/dlxbridge/dlxbridge/wire"
)

// RetryRank says which of a retry's or re-admission's headers Fit may drop
// or cut first. The copy goes back into the work queue and must reach the
// handler as the producer sent it, so every header the producer set
// travels unchanged (FixedHeader), except trace context, which only
// tracing reads and which the bridge re-injects anyway; only the bridge's
// own headers give way. A retry that still cannot fit is quarantined
// instead, where RecordRank lets the producer's headers go too.
func RetryRank(k string) Rank {
	if r, ok := ownRank(k); ok {
		return r
	}
	return FixedHeader
}

// RecordRank says which of a quarantine record's headers Fit may drop or
// cut first: the producer's headers go before the bridge's details, and
// versionHeader (the queue's schema version header) and the idempotency
// key go last of them. wire.HeaderEnvelopeSignature stands for a
// placeholder of the signature's size, written over once Fit is done.
func RecordRank(versionHeader string) func(string) Rank {
	return func(k string) Rank {
		if k == wire.HeaderEnvelopeSignature {
			return FixedHeader
		}
		if r, ok := ownRank(k); ok {
			return r
		}
		switch {
		case k == versionHeader || k == wire.HeaderIdempotencyKey:
			return IdentityHeader
		case strings.HasPrefix(k, wire.OwnPrefix) || wire.IsDeathHeader(k):
			return DetailHeader
		}
		return ProducerHeader
	}
}

// ownRank is the rank of the headers that rank alike on every publishing
// the bridge builds: trace context, the last error and what a record or a
// retry cannot do without.
func ownRank(k string) (Rank, bool) {
	switch k {
	case wire.HeaderTraceparent, wire.HeaderTracestate, wire.HeaderBaggage:
		return TraceHeader, true
	case wire.HeaderLastError:
		return DetailHeader, true
	case wire.HeaderEnvelope, wire.HeaderSource, wire.HeaderClass, wire.HeaderReason,
		wire.HeaderFingerprint, wire.HeaderAttempts, wire.HeaderFirstFailureAt,
		wire.HeaderOriginalExchange, wire.HeaderOriginalRoutingKey, wire.HeaderOriginalQueue,
		wire.HeaderIdempotencyKeyCopy, wire.HeaderOriginalExpiration, wire.HeaderOriginalUserID,
		wire.HeaderRedriveCount:
		return EssentialHeader, true
	}
	return 0, false
}
