package sidecar

import (
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/dlxbridge/dlxbridge/config"
)

// No Docker engine runs the compose file here, so this test reads it: every
// file it names exists, and every address one service uses to reach another
// is one the other listens on, as configured.

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string            `yaml:"context"`
		Dockerfile string            `yaml:"dockerfile"`
		Args       map[string]string `yaml:"args"`
	} `yaml:"build"`
	Command     any               `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
}

// mounts maps each bind mount's container path to its host path (from the
// repository root).
func (s composeService) mounts() map[string]string {
	m := map[string]string{}
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && strings.HasPrefix(parts[0], "./") {
			m[parts[1]] = parts[0]
		}
	}
	return m
}

// hostPath resolves a container path through the service's bind mounts.
func (s composeService) hostPath(t *testing.T, service, containerPath string) string {
	t.Helper()
	for c, h := range s.mounts() {
		if containerPath == c {
			return repoFile(h)
		}
		if rest, ok := strings.CutPrefix(containerPath, c+"/"); ok {
			return repoFile(h, rest)
		}
	}
	t.Errorf("%s: %s is not mounted from the repository", service, containerPath)
	return ""
}

// containerPorts lists the container side of every published port.
func (s composeService) containerPorts() map[string]bool {
	ps := map[string]bool{}
	for _, p := range s.Ports {
		parts := strings.Split(p, ":")
		ps[parts[len(parts)-1]] = true
	}
	return ps
}

func (s composeService) args() []string {
	switch c := s.Command.(type) {
	case []any:
		out := make([]string, len(c))
		for i, a := range c {
			out[i], _ = a.(string)
		}
		return out
	case string:
		return strings.Fields(c)
	}
	return nil
}

func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func TestComposeFileIsConsistent(t *testing.T) {
	t.Parallel()
	var cf composeFile
	readYAML(t, repoFile("docker-compose.yml"), &cf)
	svc := func(name string) composeService {
		s, ok := cf.Services[name]
		if !ok {
			t.Fatalf("docker-compose.yml has no service %q", name)
		}
		return s
	}
	// reaches checks that a URL or host:port names a service that listens
	// on that port (a published container port, or want).
	reaches := func(what, hostport string, listening map[string]bool) {
		t.Helper()
		host, port, err := net.SplitHostPort(hostport)
		if err != nil {
			t.Errorf("%s: %q is not host:port", what, hostport)
			return
		}
		if _, ok := cf.Services[host]; !ok {
			t.Errorf("%s: %q is not a compose service", what, host)
		}
		if !listening[port] {
			t.Errorf("%s: %s does not listen on port %s", what, host, port)
		}
	}
	urlHostPort := func(what, raw string) string {
		u, err := url.Parse(raw)
		if err != nil || u.Port() == "" {
			t.Errorf("%s: %q is not a URL with a port", what, raw)
			return ":"
		}
		return u.Host
	}

	for name, s := range cf.Services {
		if s.Build != nil {
			for _, p := range []string{s.Build.Context, filepath.Join(s.Build.Context, s.Build.Dockerfile), s.Build.Args["PKG"]} {
				if _, err := os.Stat(repoFile(p)); p != "" && err != nil {
					t.Errorf("%s: build names %s: %v", name, p, err)
				}
			}
		} else if s.Image == "" {
			t.Errorf("%s: neither image nor build", name)
		}
		for c, h := range s.mounts() {
			if _, err := os.Stat(repoFile(h)); err != nil {
				t.Errorf("%s: mounts %s at %s: %v", name, h, c, err)
			}
		}
	}

	rabbit := svc("rabbitmq").containerPorts()
	app := svc("httpconsumer")
	appPort := map[string]bool{}
	if _, p, err := net.SplitHostPort(flagValue(app.args(), "-listen")); err == nil {
		appPort[p] = true
	}

	// dlxbridge run and its config.
	d := svc("dlxbridge")
	args := d.args()
	if len(args) == 0 || args[0] != "run" {
		t.Fatalf("dlxbridge service does not run `dlxbridge run`: %v", args)
	}
	cfg, err := config.Load(d.hostPath(t, "dlxbridge", flagValue(args, "--config")))
	if err != nil {
		t.Fatalf("dlxbridge's config: %v", err)
	}
	reaches("RABBITMQ_URL", urlHostPort("RABBITMQ_URL", d.Environment["RABBITMQ_URL"]), rabbit)
	reaches("broker.management_url", urlHostPort("broker.management_url", cfg.Broker.ManagementURL), rabbit)
	appSource, _ := os.ReadFile(repoFile(app.Build.Args["PKG"], "main.go"))
	for _, q := range cfg.Queues {
		if q.Forward.URL == "" {
			t.Errorf("queue %s has no forward.url", q.Name)
			continue
		}
		reaches("queue "+q.Name+" forward.url", urlHostPort("forward.url", q.Forward.URL), appPort)
		u, _ := url.Parse(q.Forward.URL)
		if !strings.Contains(string(appSource), `"POST `+u.Path+`"`) {
			t.Errorf("queue %s forwards to %s, which examples/httpconsumer does not serve", q.Name, u.Path)
		}
	}
	_, listenPort, _ := net.SplitHostPort(cfg.Run.Listen)
	if !d.containerPorts()[listenPort] {
		t.Errorf("run.listen port %s is not published by the dlxbridge service", listenPort)
	}
	jaeger := svc("jaeger").containerPorts()
	reaches("OTEL_EXPORTER_OTLP_ENDPOINT", urlHostPort("OTEL_EXPORTER_OTLP_ENDPOINT", d.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"]), jaeger)

	// Prometheus scrapes dlxbridge and the broker, and loads the rules.
	p := svc("prometheus")
	var prom struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	promConfig := ""
	for _, a := range p.args() {
		if v, ok := strings.CutPrefix(a, "--config.file="); ok {
			promConfig = v
		}
	}
	readYAML(t, p.hostPath(t, "prometheus", promConfig), &prom)
	rules := false
	for _, rf := range prom.RuleFiles {
		if h := p.hostPath(t, "prometheus", rf); filepath.Base(h) == "alerts.yml" {
			rules = true
		}
	}
	if !rules {
		t.Error("prometheus does not load deploy/prometheus/alerts.yml")
	}
	targets := map[string]bool{}
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				targets[tg] = true
			}
		}
	}
	if !targets["dlxbridge:"+listenPort] {
		t.Errorf("prometheus does not scrape dlxbridge:%s (run.listen): %v", listenPort, targets)
	}
	if !targets["rabbitmq:15692"] || !rabbit["15692"] {
		t.Error("prometheus does not scrape the broker's Prometheus plugin on rabbitmq:15692")
	}

	// Grafana: the datasource is Prometheus, the dashboard is provisioned.
	g := svc("grafana")
	var ds struct {
		Datasources []struct {
			URL string `yaml:"url"`
		} `yaml:"datasources"`
	}
	readYAML(t, g.hostPath(t, "grafana", "/etc/grafana/provisioning/datasources/prometheus.yml"), &ds)
	if len(ds.Datasources) != 1 {
		t.Fatalf("grafana datasources: %+v", ds)
	}
	reaches("grafana datasource", urlHostPort("grafana datasource", ds.Datasources[0].URL), p.containerPorts())
	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, g.hostPath(t, "grafana", "/etc/grafana/provisioning/dashboards/dlxbridge.yml"), &prov)
	if len(prov.Providers) != 1 {
		t.Fatalf("grafana dashboard providers: %+v", prov)
	}
	dash := g.hostPath(t, "grafana", prov.Providers[0].Options.Path+"/dlxbridge.json")
	if _, err := os.Stat(dash); err != nil {
		t.Errorf("the provisioned dashboard directory has no dlxbridge.json: %v", err)
	}
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// Every query of the dashboard reads metrics the code registers or the
// rules record.
func TestDashboardUsesRegisteredMetrics(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(repoFile("deploy", "grafana", "dashboards", "dlxbridge.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	known := registeredNames(t)
	var rf ruleFile
	readYAML(t, repoFile("deploy", "prometheus", "alerts.yml"), &rf)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				known[r.Record] = true
			}
		}
	}
	queries := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries++
			for _, m := range metricNames(tg.Expr) {
				if !known[m] {
					t.Errorf("panel %q reads %s, which nothing registers", p.Title, m)
				}
			}
		}
	}
	if queries < 10 {
		t.Errorf("%d queries in the dashboard", queries)
	}
}
