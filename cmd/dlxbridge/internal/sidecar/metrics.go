package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/telemetry"
	"github.com/dlxbridge/dlxbridge/topology"
)

// Metrics are the sidecar's own collectors, beside the runtime's (which the
// consumer registers on the same registry).
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	info     *prometheus.GaugeVec
}

// NewMetrics registers the sidecar's collectors on reg and sets
// dlxbridge_queue_info for every queue of cfg.
func NewMetrics(reg prometheus.Registerer, cfg *config.Config) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlxbridge_forward_requests_total",
			Help: "Requests forwarded to a queue's endpoint, by queue and answer: 2xx, 3xx, 4xx, 5xx, or error (no answer: refused, reset, timed out).",
		}, []string{"queue", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dlxbridge_forward_duration_seconds",
			Help:    "Time from sending a forwarded request to reading its answer, by queue.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"queue"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dlxbridge_queue_info",
			Help: "Always 1; names each work queue's owner (queues[].owner, else \"unknown\") for alerts to join on.",
		}, []string{"queue", "owner"}),
	}
	if err := telemetry.Register(reg, m.requests, m.duration, m.info); err != nil {
		return nil, err
	}
	for _, q := range cfg.Queues {
		owner := q.Owner.Team
		if owner == "" {
			owner = "unknown"
		}
		m.info.WithLabelValues(q.Name, owner).Set(1)
	}
	return m, nil
}

func (m *Metrics) observe(queue string, status int, d time.Duration) {
	code := "error"
	if status > 0 {
		code = strconv.Itoa(status/100) + "xx"
	}
	m.requests.WithLabelValues(queue, code).Inc()
	m.duration.WithLabelValues(queue).Observe(d.Seconds())
}

// BrokerCollector reads queue depths and consumer counts from the
// management API at each scrape (bounded by Timeout): the work queue's
// depth and consumers, and each retry lane's depth.
type BrokerCollector struct {
	mgmt    *topology.Management
	timeout time.Duration
	queues  []brokerQueue

	up, work, consumers, lanes *prometheus.Desc
}

type brokerQueue struct {
	name  string
	lanes []lane
}

type lane struct{ name, tier, lane string }

// NewBrokerCollector builds the collector for cfg's queues.
func NewBrokerCollector(mgmt *topology.Management, cfg *config.Config) *BrokerCollector {
	b := &BrokerCollector{
		mgmt:    mgmt,
		timeout: 5 * time.Second,
		up: prometheus.NewDesc("dlxbridge_management_up",
			"1 if the last read of the management API succeeded.", nil, nil),
		work: prometheus.NewDesc("dlxbridge_work_queue_messages",
			"Messages in the work queue (ready and unacked), from the management API.", []string{"queue"}, nil),
		consumers: prometheus.NewDesc("dlxbridge_work_queue_consumers",
			"Consumers on the work queue, from the management API.", []string{"queue"}, nil),
		lanes: prometheus.NewDesc("dlxbridge_retry_lane_messages",
			"Messages waiting in a retry lane, by work queue, tier index and lane, from the management API.", []string{"queue", "tier", "lane"}, nil),
	}
	for _, q := range cfg.Queues {
		bq := brokerQueue{name: q.Name}
		for ti, d := range q.Retry.Tiers {
			if q.Retry.Shared() {
				break // a shared tier holds every queue's retries: none is this queue's alone
			}
			for l := 0; l < q.Retry.Lanes; l++ {
				bq.lanes = append(bq.lanes, lane{config.RetryQueueName(q.Name, d, l), strconv.Itoa(ti), strconv.Itoa(l)})
			}
		}
		b.queues = append(b.queues, bq)
	}
	return b
}

// Describe implements prometheus.Collector.
func (b *BrokerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- b.up
	ch <- b.work
	ch <- b.consumers
	ch <- b.lanes
}

// Collect implements prometheus.Collector.
func (b *BrokerCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	stats, err := b.read(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(b.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(b.up, prometheus.GaugeValue, 1)
	for _, q := range b.queues {
		if s, ok := stats[q.name]; ok {
			ch <- prometheus.MustNewConstMetric(b.work, prometheus.GaugeValue, float64(s.Messages), q.name)
			ch <- prometheus.MustNewConstMetric(b.consumers, prometheus.GaugeValue, float64(s.Consumers), q.name)
		}
		for _, l := range q.lanes {
			if s, ok := stats[l.name]; ok {
				ch <- prometheus.MustNewConstMetric(b.lanes, prometheus.GaugeValue, float64(s.Messages), q.name, l.tier, l.lane)
			}
		}
	}
}

type queueStats struct {
	Name      string `json:"name"`
	Messages  int64  `json:"messages"`
	Consumers int64  `json:"consumers"`
}

// read lists the vhost's queues with the two columns it needs.
func (b *BrokerCollector) read(ctx context.Context) (map[string]queueStats, error) {
	vh := b.mgmt.Vhost
	if vh == "" {
		vh = "/"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		b.mgmt.BaseURL+"/api/queues/"+url.PathEscape(vh)+"?columns=name,messages,consumers", nil)
	if err != nil {
		return nil, errors.New("management URL: no request can be made to it")
	}
	req.SetBasicAuth(b.mgmt.User, b.mgmt.Password)
	client := managementClient
	if b.mgmt.Client != nil {
		client = b.mgmt.Client // with several nodes, the one that fails over
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("management API: %s", resp.Status)
	}
	var items []queueStats
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&items); err != nil {
		return nil, err
	}
	out := make(map[string]queueStats, len(items))
	for _, it := range items {
		out[it.Name] = it
	}
	return out, nil
}

var managementClient = &http.Client{Timeout: 10 * time.Second}
