package topology

import (
	"strings"
	"testing"
)

// A verify whose every problem is a missing object says that apply declares
// them; one with any other drift (which apply does not change) does not.
func TestVerifyTextPointsAtApplyWhenOnlyObjectsAreMissing(t *testing.T) {
	t.Parallel()
	const hint = "`dlxbridge topology apply` declares them"
	missing := []Problem{{Kind: KindQueue, Object: "orders", Issue: IssueMissing}, {Kind: KindExchange, Object: "orders", Issue: IssueMissing}}
	for _, c := range []struct {
		name     string
		problems []Problem
		want     bool
	}{
		{"only missing", missing, true},
		{"an argument differs too", append(missing[:1:1], Problem{Kind: KindQueue, Object: "x", Issue: IssueArgument, Arg: "x-max-length", Want: "1", Have: "2"}), false},
		{"no drift", nil, false},
	} {
		var b strings.Builder
		r := &VerifyReport{BrokerVersion: "3.10.8", Objects: 2, Problems: c.problems}
		if err := r.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(b.String(), hint); got != c.want {
			t.Errorf("%s: hint shown %v, want %v:\n%s", c.name, got, c.want, b.String())
		}
	}
}
