package audit

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Schema names the JSON report's format. It changes only when a field
// changes meaning or goes away; new fields and new rules may appear within
// one schema.
const Schema = "dlxbridge.audit/v1"

// Severity ranks a finding.
type Severity int

const (
	// Info: worth a look; nothing is known to be lost.
	Info Severity = iota + 1
	// Warning: messages can be lost, or a dead letter lost, when
	// something else goes wrong (a node down, a full target, a crash).
	Warning
	// Error: messages are lost, or will be, as the broker is set up now,
	// or an upgrade is blocked.
	Error
	// Never is a FailOn that no finding reaches (--fail-on none).
	Never
)

var severityNames = map[Severity]string{Info: "info", Warning: "warning", Error: "error", Never: "none"}

func (s Severity) String() string {
	if n, ok := severityNames[s]; ok {
		return n
	}
	return fmt.Sprintf("severity(%d)", int(s))
}

// ParseSeverity reads "error", "warning", "info" or "none" (Never).
func ParseSeverity(s string) (Severity, bool) {
	for k, v := range severityNames {
		if v == s {
			return k, true
		}
	}
	return 0, false
}

func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s *Severity) UnmarshalText(b []byte) error {
	v, ok := ParseSeverity(string(b))
	if !ok {
		return fmt.Errorf("severity %q: want error, warning, info or none", b)
	}
	*s = v
	return nil
}

// Evidence is one setting that causes a finding: its name as a policy
// spells it (dead-letter-exchange, delivery-limit, ...) or a fact the
// broker reports (type, consumers, messages), its value (a JSON-like
// rendering: strings quoted, "none" when absent), and where the value
// comes from (argument, policy 'p', operator policy 'p', broker, the
// broker default, ...).
type Evidence struct {
	Setting string `json:"setting"`
	Value   string `json:"value"`
	Source  string `json:"source,omitempty"`
}

// Finding is one thing the audit found wrong.
type Finding struct {
	Rule     string   `json:"rule"`
	Severity Severity `json:"severity"`
	Vhost    string   `json:"vhost"`
	// Kind is queue, exchange, policy, operator-policy or broker.
	Kind   string `json:"kind"`
	Object string `json:"object"`
	// Problem says what goes wrong, Fix what to change.
	Problem  string     `json:"problem"`
	Evidence []Evidence `json:"evidence"`
	Fix      string     `json:"fix"`
}

// Counts counts what was read.
type Counts struct {
	Vhosts    int `json:"vhosts"`
	Queues    int `json:"queues"`
	Exchanges int `json:"exchanges"`
	Bindings  int `json:"bindings"`
	Policies  int `json:"policies"`
	Consumers int `json:"consumers"`
}

// Report is the audit's outcome, as `--output json` prints it.
type Report struct {
	Schema string `json:"schema"`
	Broker struct {
		Version string `json:"version"`
		Cluster string `json:"cluster"`
	} `json:"broker"`
	Vhosts  []string `json:"vhosts"`
	Scanned Counts   `json:"scanned"`
	// APIRequests counts the HTTP requests the audit sent (management API
	// and Prometheus endpoint).
	APIRequests int64 `json:"api_requests"`
	// Seconds is how long reading and checking took.
	Seconds float64 `json:"seconds"`
	// Prometheus is set when the dead-letter counters were read.
	Prometheus *PrometheusRead `json:"prometheus,omitempty"`
	FailOn     Severity        `json:"fail_on"`
	// Match is the --match pattern findings were filtered by, if any.
	Match    string    `json:"match,omitempty"`
	Findings []Finding `json:"findings"`
	// Summary counts findings by severity (all three keys always there).
	Summary map[string]int `json:"summary"`
	// NotChecked says what could not be read or checked, and why. Not
	// empty: the audit is incomplete (exit 3 when nothing reaches
	// FailOn).
	NotChecked []string `json:"not_checked"`
}

// PrometheusRead describes the two reads of the dead-letter counters.
type PrometheusRead struct {
	URL             string  `json:"url"`
	IntervalSeconds float64 `json:"interval_seconds"`
}

// Options shape Run.
type Options struct {
	// FailOn is the lowest severity that fails the audit. Defaults to
	// Warning.
	FailOn Severity
	// Match, when set, keeps only findings about objects whose names it
	// matches (broker-wide findings are always kept).
	Match *regexp.Regexp
}

// Run applies every rule to s and returns the report (without the
// request count, duration and Prometheus details, which the caller
// knows). notChecked carries what Collect could not read.
func Run(s *Snapshot, notChecked []string, opts Options) *Report {
	if opts.FailOn == 0 {
		opts.FailOn = Warning
	}
	r := &Report{Schema: Schema, FailOn: opts.FailOn, Findings: []Finding{}, NotChecked: []string{}}
	r.Broker.Version, r.Broker.Cluster = s.Version.String(), s.Cluster
	r.NotChecked = append(r.NotChecked, notChecked...)
	if opts.Match != nil {
		r.Match = opts.Match.String()
	}
	r.Vhosts = []string{}
	for _, vh := range s.Vhosts {
		r.Vhosts = append(r.Vhosts, vh.Name)
		r.Scanned.Vhosts++
		r.Scanned.Queues += len(vh.Queues)
		r.Scanned.Exchanges += len(vh.Exchanges)
		r.Scanned.Bindings += len(vh.Bindings)
		r.Scanned.Policies += len(vh.Policies)
		r.Scanned.Consumers += len(vh.Consumers)
		fs, nc := checkVhost(s, vh)
		r.Findings = append(r.Findings, fs...)
		r.NotChecked = append(r.NotChecked, nc...)
	}
	r.Findings = append(r.Findings, checkBroker(s)...)
	if opts.Match != nil {
		kept := r.Findings[:0]
		for _, f := range r.Findings {
			if f.Kind == "broker" || opts.Match.MatchString(f.Object) {
				kept = append(kept, f)
			}
		}
		r.Findings = kept
	}
	sort.SliceStable(r.Findings, func(i, j int) bool {
		a, b := r.Findings[i], r.Findings[j]
		if a.Severity != b.Severity {
			return a.Severity > b.Severity
		}
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		if a.Vhost != b.Vhost {
			return a.Vhost < b.Vhost
		}
		return a.Object < b.Object
	})
	r.Summary = map[string]int{"error": 0, "warning": 0, "info": 0}
	for _, f := range r.Findings {
		r.Summary[f.Severity.String()]++
	}
	return r
}

// Failing reports whether a finding reaches FailOn.
func (r *Report) Failing() bool {
	for _, f := range r.Findings {
		if f.Severity >= r.FailOn {
			return true
		}
	}
	return false
}

// Complete reports whether everything could be read and checked.
func (r *Report) Complete() bool { return len(r.NotChecked) == 0 }

// MarshalJSON keeps the report's field order and nil-free lists.
func (r *Report) MarshalJSON() ([]byte, error) {
	type plain Report
	p := plain(*r)
	for i := range p.Findings {
		if p.Findings[i].Evidence == nil {
			p.Findings[i].Evidence = []Evidence{}
		}
	}
	return json.Marshal(p)
}

// EvidenceText renders evidence on one line: "setting value (source), ...".
func EvidenceText(ev []Evidence) string {
	parts := make([]string, 0, len(ev))
	for _, e := range ev {
		s := e.Setting + " " + e.Value
		if e.Source != "" {
			s += " (" + e.Source + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}
