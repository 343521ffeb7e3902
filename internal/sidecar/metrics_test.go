package sidecar

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fakeQuarantine struct {
	mu     sync.Mutex
	groups []OpenRecords
	err    error
}

func (f *fakeQuarantine) OpenRecords(context.Context) ([]OpenRecords, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]OpenRecords(nil), f.groups...), f.err
}

// The quarantine gauges follow the source: counts by queue and class, and
// the oldest open record's age, growing with the clock while it sits there.
func TestQuarantineGaugesFollowTheSource(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	now := t0
	src := &fakeQuarantine{groups: []OpenRecords{
		{Queue: "orders", Class: "schema", Count: 2, Oldest: t0.Add(-90 * time.Second)},
		{Queue: "orders", Class: "schema", Count: 1, Oldest: t0.Add(-10 * time.Second)},
		{Queue: "orders", Class: "permanent", Count: 1, Oldest: t0.Add(-30 * time.Second)},
		{Queue: "mail", Class: "transient", Count: 0},
	}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewQuarantineCollector(src, func() time.Time { return now }))
	want := func(text string) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(text),
			"dlxbridge_quarantine_open_records", "dlxbridge_quarantine_oldest_open_age_seconds"); err != nil {
			t.Error(err)
		}
	}
	head := `
# HELP dlxbridge_quarantine_oldest_open_age_seconds Age of the oldest open quarantine record, by work queue.
# TYPE dlxbridge_quarantine_oldest_open_age_seconds gauge
`
	open := `# HELP dlxbridge_quarantine_open_records Quarantine records neither replayed nor purged, by work queue and failure class.
# TYPE dlxbridge_quarantine_open_records gauge
dlxbridge_quarantine_open_records{class="permanent",queue="orders"} 1
dlxbridge_quarantine_open_records{class="schema",queue="orders"} 3
dlxbridge_quarantine_open_records{class="transient",queue="mail"} 0
`
	want(head + "dlxbridge_quarantine_oldest_open_age_seconds{queue=\"orders\"} 90\n" + open)
	now = t0.Add(time.Minute)
	want(head + "dlxbridge_quarantine_oldest_open_age_seconds{queue=\"orders\"} 150\n" + open)

	// A source that fails exports nothing rather than stale numbers.
	src.mu.Lock()
	src.err = errors.New("broker unreachable")
	src.mu.Unlock()
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Errorf("with a failing source: %d series, %v", n, err)
	}
}
