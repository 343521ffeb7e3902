package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/consumer"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/quarantine"
	"github.com/dlxbridge/dlxbridge/schemas"
	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/triage"
)

// Topology modes: what Run does with the broker's topology before it
// consumes.
const (
	// TopologyVerify refuses to start when the broker differs from the
	// config (missing objects, differing arguments, overriding policies).
	TopologyVerify = "verify"
	// TopologyApply declares what is missing first (refusing, like
	// `topology apply`, when an object conflicts), then verifies.
	TopologyApply = "apply"
	// TopologyAllowDrift verifies, logs the drift, and starts anyway.
	TopologyAllowDrift = "allow-drift"
)

// Options configure Run.
type Options struct {
	// URL is the AMQP URL, or several nodes' URLs comma separated (see
	// consumer.Config.URL). Required.
	URL string
	// Config is a completed config in which every queue has forward.url.
	// Required.
	Config *config.Config
	// Registry is the schema registry. Required.
	Registry *schemas.Registry
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Topology is TopologyVerify (the default), TopologyApply or
	// TopologyAllowDrift.
	Topology string
	// Listener, if set, is used instead of listening on run.listen (tests
	// pass one bound to port 0).
	Listener net.Listener
	// QuarantineRefresh is how often the runtime reads the quarantine
	// streams for the quarantine's metrics (quarantine.NewMetrics, on
	// run's registry; see consumer.Config.QuarantineMetrics). Each read
	// takes every record; the oldest record's age is computed at each
	// scrape regardless. Defaults to 30s.
	QuarantineRefresh time.Duration
	// ReplicaRefresh is how often /readyz's view of the queues' replicas
	// is read from the management API (only with broker.management_url):
	// a queue or stream of the config below quorum makes /readyz answer
	// 503. Defaults to 10s.
	ReplicaRefresh time.Duration
	// Page, if set, serves the quarantine page under /quarantine (see
	// Page). Defaults to none.
	Page *Page
	// Started, if set, is called with the server's address once it serves.
	Started func(addr string)
	// TracerProvider makes the runtime's spans. Defaults to the global one.
	TracerProvider trace.TracerProvider
}

// ErrDrift is returned (wrapped) when the topology differs from the config
// and Topology is TopologyVerify.
var ErrDrift = errors.New("the broker's topology differs from the config")

// Run verifies (or applies) the topology, serves /metrics, /healthz and
// /readyz, and forwards every queue's validated messages to its endpoint
// until ctx ends. Then it stops consuming, lets the requests in flight and
// the deliveries already received finish (the consumer's drain, which
// lasts at most the longest handler timeout plus 5s), stops the server and
// returns nil.
func Run(ctx context.Context, o Options) error {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "dlxbridge.run")
	cfg := o.Config
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var mgmt *topology.Management
	if cfg.Broker.ManagementURL != "" {
		m, err := topology.NewManagement(cfg.Broker.ManagementURL, o.URL)
		if err != nil {
			return fmt.Errorf("broker.management_url: %w", err)
		}
		mgmt = m
		reg.MustRegister(NewBrokerCollector(mgmt, cfg))
	}
	qmetrics, err := quarantine.NewMetrics(reg)
	if err != nil {
		return err
	}
	metrics, err := NewMetrics(reg, cfg)
	if err != nil {
		return err
	}

	var drain time.Duration
	for _, q := range cfg.Queues {
		drain = max(drain, q.Consumer.HandlerTimeout)
	}
	c, err := consumer.New(&consumer.Config{
		URL: o.URL, File: cfg, Registry: o.Registry,
		ConnectionName: cfg.Broker.ConnectionName + "/run",
		Logger:         o.Logger, Registerer: reg,
		DrainTimeout: drain + 5*time.Second, TracerProvider: o.TracerProvider,
		QuarantineMetrics: qmetrics, QuarantineRefresh: o.QuarantineRefresh,
	})
	if err != nil {
		return err
	}
	var forwarders []*Forwarder
	defer func() {
		for _, f := range forwarders {
			f.Close()
		}
	}()
	for i := range cfg.Queues {
		q := &cfg.Queues[i]
		f, err := NewForwarder(cfg, q, metrics)
		if err != nil {
			return err
		}
		forwarders = append(forwarders, f)
		for _, a := range q.Accepts {
			if err := c.Handle(q.Name, a.Type, f); err != nil {
				return err
			}
		}
	}

	h := &health{c: c}
	stopAfter := context.AfterFunc(ctx, func() { h.stopping.Store(true) })
	defer stopAfter()
	if mgmt != nil {
		h.replicas = newReplicaWatch(mgmt, cfg)
		refresh := o.ReplicaRefresh
		if refresh <= 0 {
			refresh = 10 * time.Second
		}
		wctx, stopWatch := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			h.replicas.run(wctx, refresh)
		}()
		defer func() {
			stopWatch()
			<-watched
		}()
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dlxbridge_ready",
		Help: "1 while /readyz answers ready: topology verified, connected and consuming.",
	}, func() float64 {
		if h.notReady() == "" {
			return 1
		}
		return 0
	}))
	ln := o.Listener
	if ln == nil {
		ln, err = net.Listen("tcp", cfg.Run.Listen)
		if err != nil {
			return fmt.Errorf("run.listen: %w", err)
		}
	}
	mux := h.mux(reg)
	paths := "/metrics /healthz /readyz"
	if o.Page != nil {
		o.Page.Mount(mux)
		paths += " /quarantine"
	}
	srv := newServer(mux, defaultTimeouts)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	stopServer := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if o.Page != nil {
			o.Page.Close() // its background replays stop and write their ends
		}
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
	log.Info("serving", "addr", ln.Addr().String(), "paths", paths)
	if o.Started != nil {
		o.Started(ln.Addr().String())
	}

	if err := checkTopology(ctx, o, mgmt, log); err != nil {
		return errors.Join(err, stopServer())
	}
	h.topologyOK.Store(true)

	runErr := c.Run(ctx)
	if runErr != nil {
		log.Error("stopped consuming", "error", runErr)
	} else {
		log.Info("stopped consuming")
	}
	return errors.Join(runErr, stopServer())
}

// checkTopology verifies (after applying, in TopologyApply) the topology
// over a connection of its own, and then warns if the runtime's user may
// write the quarantine's streams by name (see warnStreamWriters).
func checkTopology(ctx context.Context, o Options, mgmt *topology.Management, log *slog.Logger) error {
	mode := o.Topology
	if mode == "" {
		mode = TopologyVerify
	}
	d, err := amqpx.NewDialer(o.URL)
	if err != nil {
		return err
	}
	d.Logger = log
	conn, _, err := d.DialRetry(ctx, o.Config.Broker.ConnectionName+"/run-topology", amqpx.Retry{})
	if err != nil {
		return err
	}
	defer conn.Close()
	in := &topology.Broker{Conn: conn}
	if mgmt != nil {
		if err := in.UseManagement(ctx, mgmt); err != nil {
			log.Warn("management API unusable; verifying what AMQP can", "error", err)
		}
	}
	topo, err := topology.BuildFor(o.Config, conn)
	if err != nil {
		return err
	}
	if mode == TopologyApply {
		p, err := in.Apply(ctx, topo)
		if err != nil {
			return fmt.Errorf("topology apply: %w", err)
		}
		logApplied(log, p)
	}
	r, err := in.Verify(ctx, topo)
	if err != nil {
		return fmt.Errorf("topology verify: %w", err)
	}
	// A queue below quorum is the cluster's state, not drift: refusing to
	// start would only add a restart loop to the outage. /readyz reports it.
	drift := r.Problems[:0:0]
	for _, p := range r.Problems {
		if p.Issue == topology.IssueBelowQuorum {
			log.Warn("queue below quorum; starting anyway (/readyz reports it)", "problem", p.String())
			continue
		}
		drift = append(drift, p)
	}
	r.Problems = drift
	for _, n := range r.Notes {
		log.Info("topology note", "note", n.String())
	}
	if !r.Complete() {
		log.Warn("topology only partly verified (no management API)", "not_checked", strings.Join(r.NotChecked, "; "))
	}
	if r.OK() {
		warnStreamWriters(conn, o.URL, o.Config, log)
		return nil
	}
	var b strings.Builder
	_ = r.WriteText(&b)
	if mode == TopologyAllowDrift {
		log.Warn("topology drift; starting anyway (--allow-drift)", "report", b.String())
		warnStreamWriters(conn, o.URL, o.Config, log)
		return nil
	}
	return fmt.Errorf("%w (start with --apply to declare what is missing, or --allow-drift):\n%s", ErrDrift, b.String())
}

// health serves /healthz and /readyz.
type health struct {
	c          *consumer.Consumer
	topologyOK atomic.Bool
	stopping   atomic.Bool
	replicas   *replicaWatch // nil without the management API
}

func (h *health) mux(reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		why := h.notReady()
		if why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
		// Which node of the list the runtime is on: after a failover,
		// the one that took over.
		if n := h.c.Node(); n != "" {
			_, _ = fmt.Fprintf(w, "node: %s\n", n)
		}
		// A queue whose breaker paused it is the bridge working as
		// intended (its dependency is down): listed, still ready.
		for _, b := range h.c.Breakers() {
			if b.Paused() {
				_, _ = fmt.Fprintf(w, "paused: %s (circuit breaker %s%s)\n", b.Queue, b.State, pausedUntil(b))
			}
		}
		// Members offline with a majority online: still served, one
		// node short of stopping.
		_, offline, err := h.replicas.status()
		for _, o := range offline {
			_, _ = fmt.Fprintf(w, "replicas offline: %s\n", o)
		}
		if err != nil {
			_, _ = fmt.Fprintf(w, "replicas unknown: the management API did not answer: %v\n", err)
		}
	})
	return mux
}

// pausedUntil says until when an open breaker pauses its queue.
func pausedUntil(b consumer.BreakerStatus) string {
	if b.State != triage.BreakerOpen || b.Until.IsZero() {
		return ""
	}
	return ", until " + b.Until.UTC().Format(time.RFC3339)
}

func (h *health) notReady() string {
	switch {
	case h.stopping.Load():
		return "stopping: finishing the messages in flight"
	case !h.topologyOK.Load():
		return "topology not verified"
	}
	// Both reasons when both hold: a queue below quorum is usually why
	// the runtime lost its consumer.
	var why []string
	if !h.c.Ready() {
		why = append(why, "not connected and consuming")
	}
	if below := h.replicas.belowQuorum(); below != "" {
		why = append(why, below)
	}
	return strings.Join(why, "; ")
}

// logApplied says what --apply changed on the broker, object by object: an
// operator reading the log after a deploy must not need a plan. The
// objects come maxObjectsLine bytes to a line at most, so that a first
// apply of many queues (840 objects for 100, one line of 97 KB) stays in
// lines a log pipeline keeps whole.
func logApplied(log *slog.Logger, p *topology.Plan) {
	var lines []string
	var b strings.Builder
	created := 0
	for _, s := range p.Steps {
		if s.Action != topology.ActionCreate {
			continue
		}
		created++
		if b.Len() > 0 && b.Len()+2+len(s.Object) > maxObjectsLine {
			lines, b = append(lines, b.String()), strings.Builder{}
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(s.Object)
	}
	lines = append(lines, b.String())
	log.Info("topology applied", "created", created, "unchanged", p.Summary.Unchanged, "ensured", p.Summary.Ensure,
		"objects", lines[0])
	for i, l := range lines[1:] {
		log.Info("topology applied, more objects created", "part", fmt.Sprintf("%d/%d", i+2, len(lines)), "objects", l)
	}
}

// maxObjectsLine bounds the object list of one line of logApplied.
const maxObjectsLine = 4 << 10
