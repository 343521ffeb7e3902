package sidecar

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
)

// repoFile is a path from the repository root.
func repoFile(parts ...string) string {
	return filepath.Join(append([]string{"..", "..", "..", ".."}, parts...)...)
}

// descRecorder is a Registerer that keeps the fully-qualified name of every
// metric a collector describes, samples or not.
type descRecorder struct{ names map[string]bool }

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *descRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqNameRE.FindStringSubmatch(desc.String()); m != nil {
			d.names[m[1]] = true
		}
	}
	return nil
}

func (d *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d *descRecorder) Unregister(prometheus.Collector) bool { return true }

// registeredNames builds the consumer's and the sidecar's collectors, as
// `dlxbridge run` does, and returns every metric name they describe
// (histograms with their _bucket, _sum and _count series).
func registeredNames(t *testing.T) map[string]bool {
	t.Helper()
	cfg := testConfig(t, "http://127.0.0.1:1/x", 1)
	reg, err := schemas.Load(schemas.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &descRecorder{names: map[string]bool{}}
	if _, err := consumer.New(&consumer.Config{URL: "amqp://guest:guest@127.0.0.1:5672/", File: cfg, Registry: reg, Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewMetrics(rec, cfg); err != nil {
		t.Fatal(err)
	}
	mgmt, err := topology.NewManagement("http://127.0.0.1:15672", "amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		t.Fatal(err)
	}
	rec.MustRegister(NewBrokerCollector(mgmt, cfg))
	if _, err := quarantine.NewMetrics(rec); err != nil {
		t.Fatal(err)
	}
	rec.names["dlxbridge_ready"] = true // a GaugeFunc that Run registers
	for n := range rec.names {
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			rec.names[n+s] = true
		}
	}
	return rec.names
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record      string            `yaml:"record"`
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

var (
	quotedRE   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	matchersRE = regexp.MustCompile(`\{[^}]*\}`)
	rangeRE    = regexp.MustCompile(`\[[^\]]*\]`)
	groupingRE = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	offsetRE   = regexp.MustCompile(`\boffset\s+[0-9a-z]+`)
	identRE    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	keywords   = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression selects:
// identifiers that are not functions, keywords, label names or durations.
func metricNames(expr string) []string {
	e := quotedRE.ReplaceAllString(expr, `""`)
	e = matchersRE.ReplaceAllString(e, " ")
	e = rangeRE.ReplaceAllString(e, " ")
	e = groupingRE.ReplaceAllString(e, " ")
	e = offsetRE.ReplaceAllString(e, " ")
	var names []string
	for _, m := range identRE.FindAllStringSubmatch(e, -1) {
		if m[1] != "" { // followed by "(": a function or aggregation
			continue
		}
		if id := strings.TrimSpace(m[0]); !keywords[strings.ToLower(id)] {
			names = append(names, id)
		}
	}
	return names
}

func TestMetricNamesOfAnExpression(t *testing.T) {
	t.Parallel()
	got := metricNames(`sum by (queue) (rate(a_total{outcome=~"x|y",q="{}"}[5m] offset 1h)) > 2 * b:rec unless on (queue) c and bool d * on (queue) group_left (owner) max by (queue, owner) (info)`)
	want := []string{"a_total", "b:rec", "c", "d", "info"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("got %v, want %v", got, want)
	}
}

// Every alert reads only metrics the code registers (or rules of the same
// file record), names the queue and the owner, and links its runbook entry,
// which exists.
func TestAlertRulesUseRegisteredMetrics(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(repoFile("deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(data, &rf); err != nil {
		t.Fatal(err)
	}
	known := registeredNames(t)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				known[r.Record] = true
			}
		}
	}
	runbook, _ := os.ReadFile(repoFile("docs", "runbook.md"))
	alerts := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			for _, m := range metricNames(r.Expr) {
				if !known[m] {
					t.Errorf("%s reads %s, which the code does not register", name, m)
				}
			}
			if r.Alert == "" {
				continue
			}
			alerts++
			if !strings.Contains(r.Expr, "group_left (owner)") || !strings.Contains(r.Expr, "dlxbridge_queue_info") {
				t.Errorf("%s does not join the owner from dlxbridge_queue_info", name)
			}
			s := r.Annotations["summary"]
			if !strings.Contains(s, "$labels.queue") || !strings.Contains(s, "$labels.owner") {
				t.Errorf("%s: summary %q does not name the queue and the owner", name, s)
			}
			anchor := strings.ToLower(r.Alert)
			if u := r.Annotations["runbook_url"]; !strings.HasSuffix(u, "docs/runbook.md#"+anchor) {
				t.Errorf("%s: runbook_url %q does not point at docs/runbook.md#%s", name, u, anchor)
			}
			if !strings.Contains(string(runbook), "\n## "+r.Alert+"\n") {
				t.Errorf("%s: docs/runbook.md has no section '## %s'", name, r.Alert)
			}
		}
	}
	if alerts < 5 {
		t.Errorf("%d alerts, want at least 5", alerts)
	}
	for _, want := range []string{"dlxbridge_quarantine_records", "dlxbridge_quarantine_oldest_open_age_seconds", "dlxbridge_queue_info"} {
		if !known[want] {
			t.Errorf("%s is not registered", want)
		}
	}
}

// promtool, where it is installed (Debian's prometheus package has it; set
// PROMTOOL to its path otherwise), checks the rules and runs their unit
// tests.
func TestAlertRulesWithPromtool(t *testing.T) {
	t.Parallel()
	bin := os.Getenv("PROMTOOL")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("promtool"); err != nil {
			t.Skip("promtool is not installed (set PROMTOOL); TestAlertRulesUseRegisteredMetrics checks the metric names")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := repoFile("deploy", "prometheus")
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

var _ prometheus.Registerer = (*descRecorder)(nil)
