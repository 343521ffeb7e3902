package wire

import "testing"

func TestHeaderClasses(t *testing.T) {
	t.Parallel()
	for _, k := range []string{HeaderXDeath, HeaderDeliveryCount, HeaderAcquiredCount, HeaderFirstDeathQueue, HeaderLastDeathReason} {
		if !IsBrokerHeader(k) {
			t.Errorf("IsBrokerHeader(%q) = false", k)
		}
	}
	if !IsCountHeader(HeaderAcquiredCount) || IsCountHeader(HeaderXDeath) {
		t.Error("IsCountHeader")
	}
	if IsDeathHeader(HeaderDeliveryCount) || IsDeathHeader(HeaderAcquiredCount) || IsBrokerHeader(HeaderAttempts) || IsBrokerHeader("x-custom") {
		t.Error("broker header classes too wide")
	}
	if !isTraceHeader(HeaderBaggage) || isTraceHeader(HeaderTraceID) {
		t.Error("IsTraceHeader")
	}
}
