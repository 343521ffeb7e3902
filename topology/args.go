package topology

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// ArgDiff is one argument (or property) of one object that differs between
// the config (Want) and the broker (Have). "none" means absent.
type ArgDiff struct {
	// Object names what differs, e.g. "queue 'orders'".
	Object string `json:"object"`
	Arg    string `json:"arg"`
	Want   string `json:"want"`
	Have   string `json:"have"`
}

func (d ArgDiff) String() string {
	return fmt.Sprintf("%s: %s: want %s, have %s", d.Object, d.Arg, d.Want, d.Have)
}

// none is how an absent argument is shown (the broker's own word for it).
const none = "none"

// FormatArg renders an argument value canonically: integers of any width
// (int32, int64, a JSON number) print the same, strings are quoted, so two
// values are equal exactly when their renderings are.
func FormatArg(v any) string {
	switch x := v.(type) {
	case nil:
		return none
	case string:
		return strconv.Quote(x)
	case bool:
		return strconv.FormatBool(x)
	case int:
		return strconv.FormatInt(int64(x), 10)
	case int8:
		return strconv.FormatInt(int64(x), 10)
	case int16:
		return strconv.FormatInt(int64(x), 10)
	case int32:
		return strconv.FormatInt(int64(x), 10)
	case int64:
		return strconv.FormatInt(x, 10)
	case uint8:
		return strconv.FormatUint(uint64(x), 10)
	case uint16:
		return strconv.FormatUint(uint64(x), 10)
	case uint32:
		return strconv.FormatUint(uint64(x), 10)
	case uint64:
		return strconv.FormatUint(x, 10)
	case float32:
		return formatFloat(float64(x))
	case float64:
		return formatFloat(x)
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return strconv.FormatInt(i, 10)
		}
		if f, err := x.Float64(); err == nil {
			return formatFloat(f)
		}
		return x.String()
	default:
		b, err := json.Marshal(x)
		if err != nil {
			return fmt.Sprintf("%v", x)
		}
		return string(b)
	}
}

func formatFloat(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// diffArgs compares every argument in want and have, extra ones on the
// broker included, in argument-name order.
func diffArgs(object string, want, have map[string]any) []ArgDiff {
	keys := map[string]bool{}
	for k := range want {
		keys[k] = true
	}
	for k := range have {
		keys[k] = true
	}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	var diffs []ArgDiff
	for _, k := range names {
		w, h := FormatArg(want[k]), FormatArg(have[k])
		if w != h {
			diffs = append(diffs, ArgDiff{Object: object, Arg: k, Want: w, Have: h})
		}
	}
	return diffs
}

// inequivalentRE matches the broker's 406 text for a mismatched redeclare:
//
//	inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '2000' of type 'signedint' but current is none
//	inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received '9' but current is '5'
//	inequivalent arg 'type' for exchange 'x' in vhost '/': received 'direct' but current is 'topic'
var inequivalentRE = regexp.MustCompile(`inequivalent arg '([^']*)' for (queue|exchange) '(.*)' in vhost '.*': received (.*) but current is (.*)$`)

// valueRE matches one side of that text: "none", "'5'" or
// "the value '2000' of type 'signedint'".
var valueRE = regexp.MustCompile(`^(?:the value )?'(.*?)'(?: of type '([^']*)')?$`)

// ParseInequivalent turns the broker's 406 PRECONDITION_FAILED text for a
// mismatched redeclare into a structured difference: Want is what was
// declared ("received"), Have what the broker holds ("current"). Strings are
// quoted like FormatArg does when the broker names their type (longstr) or
// the argument is known to be a string. ok is false for any other text.
func ParseInequivalent(reason string) (d ArgDiff, ok bool) {
	m := inequivalentRE.FindStringSubmatch(strings.TrimSpace(reason))
	if m == nil {
		return ArgDiff{}, false
	}
	d = ArgDiff{Object: m[2] + " '" + m[3] + "'", Arg: m[1]}
	d.Want = parseSide(m[1], m[4])
	d.Have = parseSide(m[1], m[5])
	return d, true
}

func parseSide(arg, s string) string {
	s = strings.TrimSpace(s)
	if s == none {
		return none
	}
	m := valueRE.FindStringSubmatch(s)
	if m == nil {
		return s
	}
	val, typ := m[1], m[2]
	switch {
	case arg == ArgMaxAge && isDigits(val):
		return maxAgeFromMillis(val)
	case typ == "longstr" || stringArgs[arg]:
		return strconv.Quote(val)
	default:
		return val
	}
}

// maxAgeFromMillis renders a bare x-max-age from a 406 text. RabbitMQ 4.3
// compares stream retention after converting it to milliseconds and names
// the converted values ("received '1209600000' but current is '60000'"),
// where earlier versions echo the declared strings ("14D", "60s"). The
// broker's units are whole seconds or more, so a millisecond value divisible
// by 1000 is written back in seconds, as config writes retention; any other
// keeps its unit visible.
func maxAgeFromMillis(ms string) string {
	n, err := strconv.ParseInt(ms, 10, 64)
	switch {
	case err != nil:
		return ms
	case n%1000 == 0:
		return strconv.FormatInt(n/1000, 10) + "s"
	default:
		return ms + "ms"
	}
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// stringArgs are the arguments whose values are strings, so a 406 that does
// not name the type still renders like FormatArg.
var stringArgs = map[string]bool{
	ArgQueueType:          true,
	ArgDeadLetterExchange: true,
	ArgDeadLetterRK:       true,
	ArgDeadLetterStrategy: true,
	ArgOverflow:           true,
	ArgAlternateExchange:  true,
	"type":                true,
}
