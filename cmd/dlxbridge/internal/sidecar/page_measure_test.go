package sidecar

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/quarantine"
)

// TestMeasurePageMemory measures, and does not judge, what parallel GETs
// of the quarantine page cost `dlxbridge run` in memory: it quarantines
// DLXBRIDGE_MEASURE_PAGE_RECORDS schema-invalid messages (default 200) of
// DLXBRIDGE_MEASURE_PAGE_BYTES each (default 256 KiB) through a running
// sidecar, then, for each of /quarantine, the group and one record and
// for 1, 12 and 50 parallel GETs, starts a fresh sidecar on the same
// quarantine, waits for its metrics' first read, resets its peak RSS
// (/proc/PID/clear_refs) and logs its RSS before, its peak during the
// GETs, the answers and their times. The metrics refresh is set to an hour
// so that only the page reads during the GETs.
//
//	DLXBRIDGE_MEASURE_PAGE=1 go test -run TestMeasurePageMemory -v ./cmd/dlxbridge/internal/sidecar/
//
// DLXBRIDGE_MEASURE_BINARY=path measures that build of dlxbridge instead
// (an earlier commit's, for a before and after).
func TestMeasurePageMemory(t *testing.T) {
	if os.Getenv("DLXBRIDGE_MEASURE_PAGE") == "" {
		t.Skip("set DLXBRIDGE_MEASURE_PAGE=1 to measure")
	}
	n := envInt("DLXBRIDGE_MEASURE_PAGE_RECORDS", 200)
	size := envInt("DLXBRIDGE_MEASURE_PAGE_BYTES", 256<<10)
	env := brokertest.Require(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(srv.Close)
	cfgPath := writeSidecarConfig(t, env, srv.URL+"/work", 1)

	// Seed through the runtime: an extra property fails the schema, so
	// each message is quarantined at once with its whole body.
	seeder := startSidecarOn(t, env, cfgPath, "--quarantine-refresh", "1h")
	pad := strings.Repeat("x", max(0, size-40))
	bodies := map[string]string{}
	for i := range n {
		bodies[fmt.Sprintf("m-%d", i)] = fmt.Sprintf(`{"id":"m-%d","pad":"%s"}`, i, pad)
	}
	publish(t, env, env.Name("ex"), bodies)
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var snap *quarantine.Snapshot
	deadline := time.Now().Add(2 * time.Minute)
	for {
		conn := env.Dial("measure-check")
		s, err := (&quarantine.Inspector{Conn: conn, Config: cfg}).Snapshot(context.Background())
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Records) >= n {
			snap = s
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records after 2 minutes", len(s.Records), n)
		}
		time.Sleep(time.Second)
	}
	seeder.stop()
	var stored int
	for _, r := range snap.Records {
		stored += len(r.Body)
	}
	groups := snap.Stats(quarantine.Filter{})
	g := groups[0]
	groupPath := "/quarantine/group?" + url.Values{"queue": {g.Queue}, "class": {g.Class}, "fingerprint": {g.Fingerprint}}.Encode()
	recordPath := "/quarantine/record/" + snap.Records[n/2].ID
	t.Logf("quarantine: %d records, %d payload bytes (%.1f MB), %d group(s)", len(snap.Records), stored, float64(stored)/1e6, len(groups))
	snap = nil

	for _, path := range []string{"/quarantine", groupPath, recordPath} {
		for _, par := range []int{1, 12, 50} {
			p := startSidecarOn(t, env, cfgPath, "--quarantine-refresh", "1h")
			p.waitOpen(n, time.Minute)
			base := procKB(t, p.cmd.Process.Pid, "VmRSS")
			if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.cmd.Process.Pid), []byte("5"), 0); err != nil {
				t.Fatalf("reset the peak RSS: %v", err)
			}
			codes, times := parallelGets(t, "http://"+p.addr+path, par)
			peak := procKB(t, p.cmd.Process.Pid, "VmHWM")
			name := path
			if len(name) > 20 {
				name = name[:20] + "…"
			}
			t.Logf("%-22s %2d parallel: RSS %4d MB before, peak %4d MB (+%d MB); answers %v; time median %s, max %s",
				name, par, base/1024, peak/1024, (peak-base)/1024, codes, times[len(times)/2].Round(time.Millisecond), times[len(times)-1].Round(time.Millisecond))
			p.stop()
		}
	}
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// parallelGets sends n GETs of u at once and returns how many answered
// each status and their times, sorted.
func parallelGets(t *testing.T, u string, n int) (map[int]int, []time.Duration) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		codes = map[int]int{}
		times []time.Duration
		start = make(chan struct{})
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A transport each: n connections, none waiting for another.
			c := &http.Client{Transport: &http.Transport{}, Timeout: 2 * time.Minute}
			<-start
			t0 := time.Now()
			code := 0
			if resp, err := c.Get(u); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
			}
			mu.Lock()
			codes[code]++
			times = append(times, time.Since(t0))
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	return codes, times
}

// procKB reads one "kB" line of /proc/PID/status.
func procKB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// waitOpen polls /metrics until the quarantine's metrics count want open
// records: the runtime's first read of the quarantine is over.
func (p *sidecarProc) waitOpen(want int, within time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		_, body := p.get("/metrics")
		open := 0
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "dlxbridge_quarantine_records{") && strings.Contains(line, `state="open"`) {
				v, _ := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
				open += int(v)
			}
		}
		if open >= want {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%d open records in the metrics after %s, want %d", open, within, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop ends the sidecar with SIGTERM and waits for it.
func (p *sidecarProc) stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.t.Fatalf("dlxbridge run did not stop within 30s of SIGTERM")
	}
}
