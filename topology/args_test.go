package topology_test

import (
	"encoding/json"
	"testing"

	"github.com/dlxbridge/dlxbridge/topology"
)

func TestParseInequivalent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, reason string
		want         topology.ArgDiff
	}{
		{
			name:   "3.10 typed value vs none",
			reason: "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '2000' of type 'signedint' but current is none",
			want:   topology.ArgDiff{Object: "queue 'q'", Arg: "x-message-ttl", Want: "2000", Have: "none"},
		},
		{
			name:   "3.10 same type, both values",
			reason: "inequivalent arg 'x-delivery-limit' for queue 'orders' in vhost '/': received '9' but current is '5'",
			want:   topology.ArgDiff{Object: "queue 'orders'", Arg: "x-delivery-limit", Want: "9", Have: "5"},
		},
		{
			name:   "4.3 stream retention in milliseconds",
			reason: "PRECONDITION_FAILED - inequivalent arg 'x-max-age' for queue 'q.records' in vhost '/': received '1209600000' but current is '60000'",
			want:   topology.ArgDiff{Object: "queue 'q.records'", Arg: "x-max-age", Want: "1209600s", Have: "60s"},
		},
		{
			name:   "4.0 stream retention as declared",
			reason: "PRECONDITION_FAILED - inequivalent arg 'x-max-age' for queue 'q.records' in vhost '/': received '1209600s' but current is '1D'",
			want:   topology.ArgDiff{Object: "queue 'q.records'", Arg: "x-max-age", Want: "1209600s", Have: "1D"},
		},
		{
			name:   "none vs typed string",
			reason: "inequivalent arg 'x-dead-letter-strategy' for queue 'a.b:c' in vhost 'vh': received none but current is the value 'at-least-once' of type 'longstr'",
			want:   topology.ArgDiff{Object: "queue 'a.b:c'", Arg: "x-dead-letter-strategy", Want: "none", Have: `"at-least-once"`},
		},
		{
			name:   "queue type",
			reason: "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received the value 'quorum' of type 'longstr' but current is none",
			want:   topology.ArgDiff{Object: "queue 'q'", Arg: "x-queue-type", Want: `"quorum"`, Have: "none"},
		},
		{
			name:   "exchange type",
			reason: "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'orders' in vhost '/': received 'topic' but current is 'direct'",
			want:   topology.ArgDiff{Object: "exchange 'orders'", Arg: "type", Want: `"topic"`, Have: `"direct"`},
		},
		{
			name:   "4.x negative limit",
			reason: "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q.quarantine' in vhost '/': received the value '-1' of type 'long' but current is the value '20' of type 'long'",
			want:   topology.ArgDiff{Object: "queue 'q.quarantine'", Arg: "x-delivery-limit", Want: "-1", Have: "20"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := topology.ParseInequivalent(tt.reason)
			if !ok || got != tt.want {
				t.Fatalf("got %+v (ok %v), want %+v", got, ok, tt.want)
			}
		})
	}
	if _, ok := topology.ParseInequivalent("NOT_FOUND - no queue 'q' in vhost '/'"); ok {
		t.Fatal("parsed a 404 as an inequivalence")
	}
}

func TestFormatArgIntWidthsAreEqual(t *testing.T) {
	t.Parallel()
	for _, v := range []any{int32(5), int64(5), 5, uint16(5), float64(5), json.Number("5")} {
		if got := topology.FormatArg(v); got != "5" {
			t.Errorf("FormatArg(%T 5) = %q", v, got)
		}
	}
	if topology.FormatArg("5") == topology.FormatArg(int64(5)) {
		t.Error("string \"5\" and number 5 must differ")
	}
	if got := topology.FormatArg(nil); got != "none" {
		t.Errorf("FormatArg(nil) = %q", got)
	}
}
