package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/audit"
	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
	"github.com/dlxbridge/dlxbridge/topology"
)

// defaultManagementURL is where audit looks without --management-url or
// $RABBITMQ_MANAGEMENT_URL.
const defaultManagementURL = "http://127.0.0.1:15672"

// runAudit: dlxbridge audit. Read-only: it only GETs the management API
// (and, with --prometheus, the Prometheus endpoint); it needs no config
// file and opens no AMQP connection. Exit 0: nothing at or above
// --fail-on; 1: a finding at or above it, or the API could not be read at
// all; 2: usage; 3: nothing at or above it, but something could not be
// read or checked (the report says what).
func runAudit(ctx context.Context, env *Env, args []string) int {
	fs := newFlagSet(env, "audit", "audit [--vhost V | --all-vhosts] [--management-url URL] [--url amqp://...] [--match REGEX] [--fail-on error|warning|info|none] [--prometheus URL [--prometheus-interval 10s]] [--request-timeout 2m] [--output text|json] [--wide] [--suggest QUEUE]")
	var (
		c                             common
		mgmtURL, vhost, match, failOn string
		promURL, suggest              string
		allVhosts, wide               bool
		pageSize                      int
		promInterval, requestTimeout  time.Duration
	)
	fs.StringVar(&c.url, "url", "", "AMQP URL whose credentials (and vhost) the management API is read with when --management-url has none (default $RABBITMQ_URL, else the local default)")
	fs.StringVar(&c.output, "output", "text", "output format: text or json")
	fs.StringVar(&mgmtURL, "management-url", "", "management API base URL (default $RABBITMQ_MANAGEMENT_URL, else "+defaultManagementURL+"); the monitoring tag is enough")
	fs.StringVar(&vhost, "vhost", "", "the virtual host to audit (default the AMQP URL's, usually /)")
	fs.BoolVar(&allVhosts, "all-vhosts", false, "audit every virtual host")
	fs.StringVar(&match, "match", "", "report only findings about queues, exchanges and policies whose names match this regular expression (the whole vhost is still read: routes cross names)")
	fs.StringVar(&failOn, "fail-on", "warning", "exit 1 on a finding of this severity or higher: error, warning, info, or none (never)")
	fs.StringVar(&promURL, "prometheus", "", "the broker's Prometheus endpoint, e.g. http://127.0.0.1:15692: read twice to see dead letters being dropped now")
	fs.DurationVar(&promInterval, "prometheus-interval", 10*time.Second, "time between the two reads of --prometheus")
	fs.IntVar(&pageSize, "page-size", mgmtapi.MaxPageSize, "queues or exchanges per API request (10-500)")
	fs.DurationVar(&requestTimeout, "request-timeout", 2*time.Minute, "how long one API request may take (a 3.10 broker with 20,000 queues took more than 30 s for a page of 500)")
	fs.BoolVar(&wide, "wide", false, "text: no line wrapping, names uncut")
	fs.StringVar(&suggest, "suggest", "", "print a config.yaml fragment that brings this existing queue under the bridge, instead of the findings")
	if code, ok := parseFlags(env, fs, args); !ok {
		return code
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(env.Stderr, "dlxbridge audit: %s\n", fmt.Sprintf(format, a...))
		return ExitUsage
	}
	if fs.NArg() > 0 {
		return usage("unexpected argument %q", fs.Arg(0))
	}
	if !c.checkOutput(env) {
		return ExitUsage
	}
	if allVhosts && vhost != "" {
		return usage("--vhost and --all-vhosts exclude each other")
	}
	if pageSize < mgmtapi.MinPageSize || pageSize > mgmtapi.MaxPageSize {
		return usage("--page-size must be %d to %d, not %d", mgmtapi.MinPageSize, mgmtapi.MaxPageSize, pageSize)
	}
	if promInterval <= 0 {
		return usage("--prometheus-interval must be positive")
	}
	if requestTimeout <= 0 {
		return usage("--request-timeout must be positive")
	}
	sev, ok := audit.ParseSeverity(failOn)
	if !ok {
		return usage("--fail-on must be error, warning, info or none, not %q", failOn)
	}
	opts := audit.Options{FailOn: sev}
	if match != "" {
		re, err := regexp.Compile(match)
		if err != nil {
			return usage("--match: %v", err)
		}
		opts.Match = re
	}
	if suggest != "" && allVhosts {
		return usage("--suggest reads one queue of one vhost: drop --all-vhosts")
	}
	amqpURL, ok := c.checkedURL(env, "audit")
	if !ok {
		return ExitUsage
	}
	from := "--management-url"
	if mgmtURL == "" {
		mgmtURL, from = env.Getenv("RABBITMQ_MANAGEMENT_URL"), "$RABBITMQ_MANAGEMENT_URL"
	}
	if mgmtURL == "" {
		mgmtURL, from = defaultManagementURL, "the default management URL"
	}
	m, err := topology.NewManagement(mgmtURL, amqpURL)
	if err != nil {
		return usage("%s: %v", from, err)
	}
	// One keep-alive connection carries every page; closed when done.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	hc := &http.Client{Timeout: requestTimeout, Transport: tr}
	if m.Client != nil {
		// Several nodes' APIs: keep the transport that sends each request
		// to the node that last answered, else the next, and give every
		// node its time.
		hc.Transport, hc.Timeout = m.Client.Transport, max(hc.Timeout, m.Client.Timeout)
	}
	spec := audit.Spec{Vhost: vhost, AllVhosts: allVhosts, PageSize: pageSize, Interval: promInterval}
	if spec.Vhost == "" {
		spec.Vhost = m.Vhost
	}
	if promURL != "" {
		pc, err := audit.NewPrometheus(promURL)
		if err != nil {
			return usage("--prometheus: %v", err)
		}
		pc.HTTP = hc
		spec.Prometheus = pc
	}
	client := &mgmtapi.Client{BaseURL: m.BaseURL, User: m.User, Password: m.Password, HTTP: hc}
	if suggest != "" {
		return runSuggest(ctx, env, client, spec.Vhost, suggest)
	}
	began := time.Now()
	snap, notChecked, err := audit.Collect(ctx, client, spec)
	if err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge audit: %v\n", err)
		return ExitFail
	}
	r := audit.Run(snap, notChecked, opts)
	r.APIRequests = client.Requests()
	if spec.Prometheus != nil {
		r.APIRequests += spec.Prometheus.Requests()
		if snap.Drops != nil {
			r.Prometheus = &audit.PrometheusRead{URL: spec.Prometheus.BaseURL, IntervalSeconds: snap.Drops.IntervalSeconds}
		}
	}
	r.Seconds = time.Since(began).Seconds()
	if err := render(env.Stdout, c.output, r, func(w io.Writer) error { return writeAuditText(w, r, failOn, wide) }); err != nil {
		fmt.Fprintf(env.Stderr, "dlxbridge audit: %v\n", err)
		return ExitFail
	}
	switch {
	case r.Failing():
		return ExitFail
	case !r.Complete():
		return ExitIncomplete
	}
	return ExitOK
}

// writeAuditText renders the report for people: a block per finding, its
// lines wrapped to tableWidth unless wide, names escaped (they are other
// applications' text).
func writeAuditText(w io.Writer, r *audit.Report, failOn string, wide bool) error {
	var b strings.Builder
	vhosts := "vhost '" + printable(strings.Join(r.Vhosts, "', '"), "") + "'"
	if len(r.Vhosts) != 1 {
		vhosts = fmt.Sprintf("%d vhosts", len(r.Vhosts))
	}
	s := r.Scanned
	line(&b, wide, "", fmt.Sprintf("audit of RabbitMQ %s (cluster %s), %s: %d queues, %d exchanges, %d bindings, %d policies, %d consumers",
		r.Broker.Version, printable(r.Broker.Cluster, ""), vhosts, s.Queues, s.Exchanges, s.Bindings, s.Policies, s.Consumers))
	for _, f := range r.Findings {
		b.WriteByte('\n')
		head := fmt.Sprintf("%-8s %s  %s '%s'", strings.ToUpper(f.Severity.String()), f.Rule, f.Kind, printable(f.Object, ""))
		if len(r.Vhosts) != 1 && f.Kind != "broker" {
			head += " in vhost '" + printable(f.Vhost, "") + "'"
		}
		if !wide {
			head = fit(head, tableWidth, false)
		}
		b.WriteString(head + "\n")
		line(&b, wide, "  ", printable(f.Problem, ""))
		line(&b, wide, "  ", "evidence: "+printable(audit.EvidenceText(f.Evidence), ""))
		line(&b, wide, "  ", "fix: "+printable(f.Fix, ""))
	}
	if len(r.Findings) > 0 || len(r.NotChecked) > 0 {
		b.WriteByte('\n')
	}
	for _, n := range r.NotChecked {
		line(&b, wide, "  ", "not checked: "+printable(n, ""))
	}
	sum := r.Summary
	verdict := "ok"
	switch {
	case r.Failing():
		verdict = "FAIL"
	case !r.Complete():
		verdict = "incomplete"
	}
	line(&b, wide, "", fmt.Sprintf("audit: %s: %d error(s), %d warning(s), %d info (fails on %s); %d API requests in %.1fs",
		verdict, sum["error"], sum["warning"], sum["info"], failOn, r.APIRequests, r.Seconds))
	_, err := io.WriteString(w, b.String())
	return err
}

// line writes text wrapped at tableWidth (continuation lines indented two
// more), or whole when wide.
func line(b *strings.Builder, wide bool, indent, text string) {
	if wide {
		b.WriteString(indent + text + "\n")
		return
	}
	cur, width := indent, utf8.RuneCountInString(indent)
	first := true
	for _, word := range hardWrap(strings.Fields(text), tableWidth-utf8.RuneCountInString(indent)-2) {
		n := utf8.RuneCountInString(word)
		switch {
		case first:
			cur += word
			width += n
			first = false
		case width+1+n > tableWidth:
			b.WriteString(cur + "\n")
			cur, width = indent+"  "+word, utf8.RuneCountInString(indent)+2+n
		default:
			cur += " " + word
			width += 1 + n
		}
	}
	b.WriteString(cur + "\n")
}

// hardWrap splits words longer than n runes (a long queue name) so that
// no line is wider than the terminal.
func hardWrap(words []string, n int) []string {
	n = max(n, 10)
	var out []string
	for _, w := range words {
		r := []rune(w)
		for len(r) > n {
			out = append(out, string(r[:n]))
			r = r[n:]
		}
		out = append(out, string(r))
	}
	return out
}
