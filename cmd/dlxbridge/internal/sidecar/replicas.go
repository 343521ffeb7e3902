package sidecar

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/topology"
)

// replicaWatch reads, every refresh, the members of each queue and stream
// the config declares from the management API, for /readyz: a queue below
// quorum takes no publish and delivers nothing, so the bridge cannot do its
// work there whatever its own connection says. One list request per read;
// a readiness probe only looks at the last one.
type replicaWatch struct {
	mgmt  *topology.Management
	names map[string]bool

	mu       sync.Mutex
	read     bool     // a read has completed
	below    []string // "queue 'q': 1 of 3 replicas online (...)"
	offline  []string // some members offline, a majority online
	readErr  error    // the last read's error, nil if it worked
	lastRead time.Time
}

func newReplicaWatch(mgmt *topology.Management, cfg *config.Config) *replicaWatch {
	w := &replicaWatch{mgmt: mgmt, names: map[string]bool{}}
	for i := range cfg.Queues {
		for _, n := range cfg.Queues[i].Names(cfg.SharedTiers) {
			if n.Kind == config.KindQueue {
				w.names[n.Name] = true
			}
		}
	}
	return w
}

// run reads at once and then every refresh until ctx ends.
func (w *replicaWatch) run(ctx context.Context, refresh time.Duration) {
	t := time.NewTicker(refresh)
	defer t.Stop()
	for {
		w.poll(ctx, refresh)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (w *replicaWatch) poll(ctx context.Context, timeout time.Duration) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	qs, err := w.mgmt.QueueReplicas(rctx)
	if ctx.Err() != nil {
		return
	}
	var below, offline []string
	for i := range qs {
		q := &qs[i]
		if !w.names[q.Name] {
			continue
		}
		h, ok := q.Replicas()
		switch {
		case !ok:
		case h.BelowQuorum:
			below = append(below, fmt.Sprintf("queue '%s': %s", q.Name, h))
		case len(h.Offline) > 0:
			offline = append(offline, fmt.Sprintf("queue '%s': %s", q.Name, h))
		}
	}
	sort.Strings(below)
	sort.Strings(offline)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.readErr, w.lastRead = err, time.Now()
	if err != nil {
		// Unknown is not below quorum: what was last seen stands, and
		// /readyz says the read failed.
		return
	}
	w.read, w.below, w.offline = true, below, offline
}

// status is the last read: the queues below quorum, those with members
// offline, and the last read's error.
func (w *replicaWatch) status() (below, offline []string, err error) {
	if w == nil {
		return nil, nil, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.below, w.offline, w.readErr
}

// belowQuorum is /readyz's reason for the queues below quorum, "" if none.
func (w *replicaWatch) belowQuorum() string {
	below, _, _ := w.status()
	if len(below) == 0 {
		return ""
	}
	return "below quorum: " + strings.Join(below, "; ")
}
