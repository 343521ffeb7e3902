package audit

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/internal/mgmtapi"
)

// dropPrefix starts the names of RabbitMQ's global dead-letter counters
// (3.10+): rabbitmq_global_messages_dead_lettered_<reason>_total, labelled
// by queue_type and dead_letter_strategy. The strategy "disabled" counts
// what a queue without a dead-letter exchange dropped.
const dropPrefix = "rabbitmq_global_messages_dead_lettered_"

func dropCounter(reason string) string { return dropPrefix + reason + "_total" }

// NewPrometheus makes the client for a Prometheus endpoint's base URL
// (http(s)://host:port, no credentials: rabbitmq_prometheus serves its
// counters without a login). Its errors quote nothing of the URL.
func NewPrometheus(base string) (*mgmtapi.Client, error) {
	base = strings.TrimRight(base, "/")
	u, err := amqpx.ParseURL("Prometheus URL", base)
	if err != nil {
		return nil, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
		return nil, &amqpx.URLError{Kind: "Prometheus URL", Reason: "want http(s)://host:port, e.g. http://127.0.0.1:15692"}
	}
	return &mgmtapi.Client{BaseURL: base}, nil
}

// sampleDrops reads the counters twice, Interval apart (or around
// BetweenReads). The endpoint must be the same cluster's as the management
// API: rabbitmq_identity_info names it. What keeps the rule from running
// is noted, not an error; only the context's end is.
func sampleDrops(ctx context.Context, spec Spec, cluster string) (*DropSample, []string, error) {
	c := spec.Prometheus
	read := func() (map[DropSeries]float64, string, error) {
		body, err := c.GetBody(ctx, "/metrics")
		if err != nil {
			return nil, "", fmt.Errorf("Prometheus endpoint: %w", err)
		}
		m, id := parseDrops(body)
		return m, id, nil
	}
	before, id, err := read()
	if err != nil {
		return nil, []string{fmt.Sprintf("rule %s: %v", RuleDropping, err)}, ctx.Err()
	}
	if id != "" && cluster != "" && id != cluster {
		return nil, []string{fmt.Sprintf("rule %s: the Prometheus endpoint is of cluster %q, the management API of %q: not the same broker", RuleDropping, id, cluster)}, nil
	}
	if len(before) == 0 {
		return nil, []string{fmt.Sprintf("rule %s: the Prometheus endpoint shows no %s*_total counters (RabbitMQ 3.10 or later has them)", RuleDropping, dropPrefix)}, nil
	}
	interval := spec.Interval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	start := time.Now()
	if spec.BetweenReads != nil {
		if err := spec.BetweenReads(ctx); err != nil {
			return nil, nil, err
		}
	} else {
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		case <-t.C:
		}
	}
	after, _, err := read()
	if err != nil {
		return nil, []string{fmt.Sprintf("rule %s: second read: %v", RuleDropping, err)}, ctx.Err()
	}
	return &DropSample{IntervalSeconds: time.Since(start).Seconds(), Before: before, After: after}, nil, nil
}

// parseDrops reads, from Prometheus text exposition, the dead-letter
// counters with strategy "disabled" and the cluster name of
// rabbitmq_identity_info. Anything it does not understand is skipped.
func parseDrops(body []byte) (map[DropSeries]float64, string) {
	out := map[DropSeries]float64{}
	cluster := ""
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, labels, value, ok := parseSample(line)
		if !ok {
			continue
		}
		if name == "rabbitmq_identity_info" {
			cluster = labels["rabbitmq_cluster"]
			continue
		}
		if !strings.HasPrefix(name, dropPrefix) || !strings.HasSuffix(name, "_total") || labels["dead_letter_strategy"] != "disabled" {
			continue
		}
		reason := strings.TrimSuffix(strings.TrimPrefix(name, dropPrefix), "_total")
		if reason == "confirmed" {
			continue
		}
		out[DropSeries{Reason: reason, QueueType: labels["queue_type"]}] += value
	}
	return out, cluster
}

// parseSample splits `name{a="x",b="y"} 12` (labels optional).
func parseSample(line string) (string, map[string]string, float64, bool) {
	labels := map[string]string{}
	name, rest := line, ""
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", nil, 0, false
		}
		name, rest = line[:i], strings.TrimSpace(line[j+1:])
		for _, kv := range splitLabels(line[i+1 : j]) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			if u, err := strconv.Unquote(strings.TrimSpace(v)); err == nil {
				labels[strings.TrimSpace(k)] = u
			}
		}
	} else {
		f := strings.Fields(line)
		if len(f) < 2 {
			return "", nil, 0, false
		}
		name, rest = f[0], f[1]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return "", nil, 0, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return "", nil, 0, false
	}
	return name, labels, v, true
}

// splitLabels splits a label list at the commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	inQuote, esc, start := false, false, 0
	for i := 0; i < len(s); i++ {
		switch {
		case esc:
			esc = false
		case s[i] == '\\':
			esc = true
		case s[i] == '"':
			inQuote = !inQuote
		case s[i] == ',' && !inQuote:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}
