// Package bench is `dlxbridge bench`: the dlxbridge runtime ("bridge") and a
// plain amqp091-go consumer ("raw") drain the same pre-published messages
// from fresh quorum queues, side by side and interleaved, and every id is
// reconciled afterwards. With --floor a third side ("floor", drainFloor)
// does the least failure handling that loses nothing, by hand: the
// reference a storm's rate is read against.
//
// Each side runs in a process of its own (the command runs its own binary
// again, told what to do through the DLXBRIDGE_BENCH_SIDE environment
// variable), so its CPU time and peak RSS are its own. The parent declares
// the topology, publishes, reads the quarantine back, compares bodies byte
// for byte, and deletes everything it declared.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/topology"
)

// Exit codes, the same as the rest of the command line's.
const (
	exitOK    = 0
	exitFail  = 1 // a reconciliation mismatch, or the broker failed
	exitUsage = 2
)

// SideEnv, when set in a process's environment, makes it one side of a
// bench run: it holds the side's JSON spec.
const SideEnv = "DLXBRIDGE_BENCH_SIDE"

// ProfileEnv, when set to a directory, makes each side write a CPU profile
// of its drain there (<side>-<scenario>-<pid>.pprof), and its heap profile
// at the end (.heap.pprof): where a side's time and memory go, measured in
// the same run as its rate.
const ProfileEnv = "DLXBRIDGE_BENCH_CPUPROFILE"

// RunSideFromEnv runs one side if SideEnv is set, and says so. A test
// binary that runs the bench calls it first thing in TestMain, because the
// bench starts its sides by running its own executable again.
func RunSideFromEnv() (code int, ran bool) {
	spec := os.Getenv(SideEnv)
	if spec == "" {
		return 0, false
	}
	return side(context.Background(), spec, os.Stdout, os.Stderr), true
}

func side(ctx context.Context, spec string, stdout, stderr io.Writer) int {
	var s sideSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintf(stderr, "dlxbridge bench: bad %s: %v\n", SideEnv, err)
		return exitUsage
	}
	if dir := os.Getenv(ProfileEnv); dir != "" {
		stop, err := startProfile(dir, &s)
		if err != nil {
			fmt.Fprintf(stderr, "dlxbridge bench: %s side: %v\n", s.Side, err)
			return exitFail
		}
		defer stop()
	}
	records, enoughIn := os.NewFile(recordsFD, "records"), os.NewFile(enoughFD, "enough")
	if records == nil || enoughIn == nil {
		fmt.Fprintf(stderr, "dlxbridge bench: %s side: no pipes to the parent (fds %d, %d)\n", s.Side, recordsFD, enoughFD)
		return exitUsage
	}
	defer records.Close()
	enough := make(chan struct{})
	go func() {
		// The parent closes its end once every id expected to succeed has.
		_, _ = io.Copy(io.Discard, enoughIn)
		close(enough)
	}()
	if err := runSide(ctx, &s, records, enough, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "dlxbridge bench: %s side: %v\n", s.Side, err)
		return exitFail
	}
	return exitOK
}

// Options of a bench run: the command's flags.
type Options struct {
	URL         string
	Count       int // messages per queue and round
	Size        int // body bytes
	Prefetch    int
	Concurrency int // the bridge's workers; 0 takes the config default
	Rounds      int
	Scenarios   []string
	Output      string // text or json
	Prefix      string // every declared name starts with it
	Idle        time.Duration
	// Tiers are the retry tiers (two: 3 attempts); nil takes the defaults.
	Tiers []time.Duration
	// ImmediateRetries is the bridge's queues[].retry.immediate_retries.
	ImmediateRetries int
	// Floor adds a third side, floor (see drainFloor): the least failure
	// handling that loses nothing, to read the bridge's storm against.
	Floor bool
	// Shared adds a side, shared: the bridge retrying through shared
	// delay tiers, beside the bridge on per-queue lanes, in the same
	// rounds.
	Shared bool
	// FairFloor adds a side, fair (see drainFair): the least failure
	// handling that retries through the broker and loses nothing.
	FairFloor bool
	// AlsoC1 adds the bridge (and shared, with Shared) at concurrency 1,
	// as sides bridge-c1 (shared-c1), beside the ones at Concurrency.
	AlsoC1 bool
	// drop, for tests: take this many messages off the bridge's queue
	// before it starts, so that reconciliation must fail.
	drop int
	// dropSide is the side drop takes from: the bridge unless set.
	dropSide string
	// dup, for tests: publish ids 0 … dup-1 twice to each side (a copy
	// ahead of the rest), so that each side must count dup duplicates.
	dup int
}

// Command runs `dlxbridge bench` with args and returns the exit code.
func Command(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if spec := getenv(SideEnv); spec != "" {
		return side(ctx, spec, stdout, stderr)
	}
	// Help asked for is the command's output (stdout, exit 0); usage after
	// a mistake goes to stderr, as every other command does.
	var usage bytes.Buffer
	o, code, ok := parseFlags(args, &usage, getenv)
	if !ok {
		if code == exitOK {
			stdout.Write(usage.Bytes())
		} else {
			stderr.Write(usage.Bytes())
		}
		return code
	}
	rep, err := run(ctx, o, stderr)
	if rep != nil {
		if o.Output == "text" {
			rep.writeText(stdout)
		}
		line, _ := json.Marshal(rep)
		fmt.Fprintf(stdout, "%s\n", line)
	}
	if err != nil {
		fmt.Fprintf(stderr, "dlxbridge bench: %v\n", err)
		return exitFail
	}
	if !rep.Reconciled {
		fmt.Fprintf(stderr, "dlxbridge bench: reconciliation failed: %s\n", rep.mismatch())
		return exitFail
	}
	return exitOK
}

func parseFlags(args []string, stderr io.Writer, getenv func(string) string) (*Options, int, bool) {
	o := &Options{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var scenarios string
	fs.StringVar(&o.URL, "url", "", "AMQP URL (default $RABBITMQ_URL, else the local broker)")
	fs.IntVar(&o.Count, "count", 20000, "messages per side and round")
	fs.IntVar(&o.Size, "size", 1024, fmt.Sprintf("body size in bytes (%d to %d)", MinSize, MaxSize))
	fs.IntVar(&o.Prefetch, "prefetch", 200, "prefetch of both sides")
	fs.IntVar(&o.Concurrency, "concurrency", 0, "the bridge's concurrent handlers (0: the config default)")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds; the side that goes first alternates")
	fs.StringVar(&scenarios, "scenario", Clean+","+Storm, "scenarios, comma-separated: clean, storm")
	fs.StringVar(&o.Output, "output", "text", "text (a table, then the JSON line) or json (the JSON line only)")
	fs.StringVar(&o.Prefix, "prefix", "", "start of every declared name (default dlxbench-<random>)")
	fs.DurationVar(&o.Idle, "idle", 30*time.Second, "give a side up after this long without progress")
	fs.Func("retry-tiers", "the bridge's two retry delays, comma-separated (default 100ms,200ms): "+
		"the last always-failing message waits for both after its first attempt, a floor under a storm's duration", func(v string) error {
		var tiers []time.Duration
		for _, f := range strings.Split(v, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(f))
			if err != nil || d <= 0 {
				return fmt.Errorf("%q is not a positive duration", f)
			}
			tiers = append(tiers, d)
		}
		if len(tiers) != maxAttempts-1 {
			return fmt.Errorf("want %d delays, got %d", maxAttempts-1, len(tiers))
		}
		o.Tiers = tiers
		return nil
	})
	fs.IntVar(&o.ImmediateRetries, "immediate-retries", 0, "the bridge's in-process retries of a failed attempt before a delayed one "+
		"(queues[].retry.immediate_retries; each counts toward its 3 attempts)")
	fs.BoolVar(&o.Floor, "floor", false, "also run a third side, floor: hand-written, the least failure handling that loses nothing "+
		"(decode, an in-process second call, a confirmed publish of what fails to the quarantine, acks after confirms; no gate, envelope or retry delays), "+
		"to read the bridge's storm against what any consumer pays on this machine and broker")
	fs.BoolVar(&o.Shared, "shared-tiers", false, "also run a side \"shared\": the bridge retrying through shared delay tiers (queues[].retry.tier_queues: shared) "+
		"beside the bridge on per-queue lanes, in the same rounds")
	fs.BoolVar(&o.FairFloor, "fair-floor", false, "also run a side \"fair\": hand-written, the least failure handling that retries through the broker "+
		"(decode once, a failed attempt published to one TTL queue that dead-letters back, what cannot succeed to the quarantine, each confirmed before its delivery's ack; no gate, envelope or signature)")
	fs.BoolVar(&o.AlsoC1, "also-concurrency-1", false, "also run the bridge (and shared) at concurrency 1, as sides bridge-c1 (shared-c1), in the same rounds")
	fs.IntVar(&o.drop, "test-drop", 0, "") // hidden: see Options.drop
	fs.StringVar(&o.dropSide, "test-drop-side", Bridge, "")
	fs.IntVar(&o.dup, "test-dup", 0, "") // hidden: see Options.dup
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: dlxbridge bench [flags]

Drains the same pre-published orders.created v2 messages from fresh quorum
queues with plain amqp091-go ("raw": consume, json.Unmarshal, ack, one at a
time) and with the dlxbridge runtime ("bridge": gate, handler binding the
body), interleaved, each side in a process of its own. Scenario clean: every
message succeeds. Scenario storm: 10% schema-invalid, 20% fail once, 1% always
fail (raw has no failure handling and acks them all). With --floor, a third
side ("floor") does the least failure handling that loses nothing, by hand:
what a storm costs any consumer on this machine and broker. Then every id is
reconciled: handled (raw: acked) or quarantined, body as published,
duplicates counted apart. Exit 1 on any mismatch. Deletes what it declares.

flags:
`)
		fs.VisitAll(func(f *flag.Flag) {
			if f.Usage != "" {
				fmt.Fprintf(stderr, "  --%s (default %q)\n    \t%s\n", f.Name, f.DefValue, f.Usage)
			}
		})
		fmt.Fprint(stderr, `
environment:
  RABBITMQ_URL                 the broker when --url is not given
  DLXBRIDGE_BENCH_CPUPROFILE   a directory: each side writes a CPU profile of its drain and a heap profile at its end
  DLXBRIDGE_BENCH_BROKER_PID   the broker's beam.smp pid: print the broker's CPU time beside each side's
`)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, exitOK, false
		}
		return nil, exitUsage, false
	}
	usage := func(format string, a ...any) (*Options, int, bool) {
		fmt.Fprintf(stderr, "dlxbridge bench: "+format+"\n", a...)
		return nil, exitUsage, false
	}
	if fs.NArg() > 0 {
		return usage("unexpected argument %q", fs.Arg(0))
	}
	for _, s := range strings.Split(scenarios, ",") {
		if s = strings.TrimSpace(s); s != Clean && s != Storm {
			return usage("--scenario: unknown scenario %q (want clean, storm)", s)
		}
		o.Scenarios = append(o.Scenarios, strings.TrimSpace(s))
	}
	switch {
	case o.Count < 1:
		return usage("--count must be at least 1")
	case o.Size < MinSize || o.Size > MaxSize:
		return usage("--size must be in [%d, %d]", MinSize, MaxSize)
	case o.Prefetch < 1:
		return usage("--prefetch must be at least 1")
	case o.Concurrency < 0:
		return usage("--concurrency must be at least 0")
	case o.ImmediateRetries < 0:
		return usage("--immediate-retries must be at least 0")
	case o.Rounds < 1:
		return usage("--rounds must be at least 1")
	case o.Output != "text" && o.Output != "json":
		return usage("--output must be text or json, not %q", o.Output)
	case o.Idle <= 0:
		return usage("--idle must be positive")
	}
	if o.URL == "" {
		o.URL = getenv("RABBITMQ_URL")
	}
	if o.URL == "" {
		o.URL = amqpx.DefaultURL
	}
	if _, err := amqpx.ParseURLList(o.URL); err != nil {
		return usage("--url: %v", err) // quotes nothing of the URL
	}
	if o.Prefix == "" {
		o.Prefix = fmt.Sprintf("dlxbench-%x", time.Now().UnixNano()&0xffffffff)
	}
	return o, exitOK, true
}

// run runs every round of every scenario and reconciles them. It returns
// what it measured so far even with an error.
func run(ctx context.Context, o *Options, stderr io.Writer) (*Report, error) {
	conn, err := dial(o.URL, o.Prefix+"/bench")
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	rep := newReport(o, conn)
	// Scenarios alternate within each round, as the sides do: a storm is
	// compared with the bridge's own clean rate (bridge_storm_vs_clean),
	// which on a shared machine drifts over minutes.
	for r := range o.Rounds {
		order := sideOrder(o, r)
		for _, sc := range o.Scenarios {
			msg := func(i int) amqp.Publishing { return Publishing(i, Body(i, o.Size, KindOf(sc, i))) }
			res, err := runRound(ctx, conn, o, sc, r+1, order, msg, stderr)
			if err != nil {
				rep.finish()
				err = fmt.Errorf("%s round %d: %w", sc, r+1, err)
				rep.Reconciled, rep.Error = false, err.Error()
				return rep, err
			}
			rep.add(sc, res)
		}
	}
	rep.finish()
	return rep, nil
}

// sideOrder is round r's order of the sides o asks for: who goes first
// alternates (raw and bridge), or rotates (with more sides).
func sideOrder(o *Options, r int) []string {
	all := []string{Raw, Bridge}
	if o.Floor {
		all = append(all, Floor)
	}
	if o.FairFloor {
		all = append(all, Fair)
	}
	if o.Shared {
		all = append(all, Shared)
	}
	if o.AlsoC1 {
		all = append(all, Bridge+C1)
		if o.Shared {
			all = append(all, Shared+C1)
		}
	}
	k := r % len(all)
	return append(all[k:], all[:k]...)
}

// concurrency is side's: 1 for a C1 side, else --concurrency.
func concurrency(o *Options, side string) int {
	if strings.HasSuffix(side, C1) {
		return 1
	}
	return o.Concurrency
}

// roundResult is one round of one scenario: both sides, reconciled.
type roundResult struct {
	Round int                    `json:"round"`
	Sides map[string]*sideReport `json:"sides"`
}

// runRound declares a fresh topology per side, publishes the same messages
// to both, drains each side in order, reconciles, and deletes everything.
func runRound(ctx context.Context, conn *amqp.Connection, o *Options, sc string, round int, order []string, msg func(i int) amqp.Publishing, stderr io.Writer) (_ *roundResult, retErr error) {
	prefixes := map[string]string{}
	var exchanges []string
	for _, s := range order {
		prefix := fmt.Sprintf("%s-%s-r%d-%s", o.Prefix, sc, round, s)
		cfg, err := (&sideSpec{Side: s, Prefix: prefix, Prefetch: o.Prefetch, Concurrency: concurrency(o, s), Tiers: o.Tiers, ImmediateRetries: o.ImmediateRetries}).config()
		if err != nil {
			return nil, err
		}
		topo, err := Declare(ctx, conn, cfg)
		if topo != nil {
			defer func() {
				// Not err: the loop's own shadows the result, and a
				// failed delete (objects left on the broker) went unsaid.
				if derr := Delete(o.URL, conn, topo); derr != nil && retErr == nil {
					retErr = fmt.Errorf("delete the round's topology (%s*): %w", prefix, derr)
				}
			}()
		}
		if err != nil {
			return nil, err
		}
		prefixes[s] = prefix
		exchanges = append(exchanges, cfg.Queues[0].Exchange.Name)
	}
	if o.dup > 0 {
		if err := PublishAll(ctx, conn, exchanges, min(o.dup, o.Count), msg); err != nil {
			return nil, fmt.Errorf("publish the test duplicates: %w", err)
		}
	}
	if err := PublishAll(ctx, conn, exchanges, o.Count, msg); err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	if o.drop > 0 {
		ch, err := conn.Channel()
		if err != nil {
			return nil, err
		}
		for range o.drop {
			if d, ok, err := ch.Get(prefixes[o.dropSide]+".work", true); err != nil || !ok {
				return nil, fmt.Errorf("test drop: %v (got a message: %v)", err, ok)
			} else {
				fmt.Fprintf(stderr, "dlxbridge bench: dropped %s from the %s side's queue, as --test-drop asks\n", d.MessageId, o.dropSide)
			}
		}
		_ = ch.Close()
	}
	crcs := bodyCRCs(sc, o.Count, o.Size)
	res := &roundResult{Round: round, Sides: map[string]*sideReport{}}
	for _, s := range order {
		spec := &sideSpec{URL: o.URL, Side: s, Scenario: sc, Prefix: prefixes[s], Count: o.Count, Size: o.Size,
			Prefetch: o.Prefetch, Concurrency: concurrency(o, s), Idle: o.Idle, Tiers: o.Tiers, ImmediateRetries: o.ImmediateRetries}
		cpu0 := brokerCPU()
		sr, err := spawnSide(ctx, spec, crcs, stderr)
		if err != nil {
			return nil, err
		}
		if cpu0 >= 0 {
			if cpu1 := brokerCPU(); cpu1 >= cpu0 {
				fmt.Fprintf(stderr, "dlxbridge bench: %s round %d %s: broker CPU %.0f ms over the side's process, %.1f µs per message; the side's drain %.0f ms, its own CPU %.0f ms\n",
					sc, round, s, (cpu1-cpu0).Seconds()*1e3, (cpu1-cpu0).Seconds()*1e6/float64(o.Count), sr.Seconds*1e3, sr.CPUSeconds*1e3)
			}
		}
		rep, err := reconcile(conn, spec, sr)
		if err != nil {
			return nil, err
		}
		res.Sides[s] = rep
	}
	return res, nil
}

// spawnSide runs one side in a process of its own: this executable again,
// with the spec in SideEnv. The side streams its records through a pipe to
// a ledger here, which holds every per-message count (the side's peak RSS
// stays its consumer's own), and closes a second pipe to tell the side
// once every id expected to succeed has.
func spawnSide(ctx context.Context, spec *sideSpec, crcs []uint32, stderr io.Writer) (*sideResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	recR, recW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer recR.Close()
	enoughR, enoughW, err := os.Pipe()
	if err != nil {
		recW.Close()
		return nil, err
	}
	var once sync.Once
	enough := func() { once.Do(func() { enoughW.Close() }) }
	defer enough()
	cmd := exec.CommandContext(ctx, exe, "bench")
	cmd.Env = append(os.Environ(), SideEnv+"="+string(b))
	cmd.ExtraFiles = []*os.File{recW, enoughR} // recordsFD, enoughFD
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, stderr
	err = cmd.Start()
	recW.Close() // the side holds its own copies now
	enoughR.Close()
	if err != nil {
		return nil, fmt.Errorf("%s side: %w", spec.Side, err)
	}
	l := newLedger(spec, crcs, enough)
	read := make(chan error, 1)
	go func() {
		err := l.read(recR)
		_, _ = io.Copy(io.Discard, recR) // after a bad record: never leave the side blocked on a full pipe
		read <- err
	}()
	err = cmd.Wait()
	rerr := <-read // EOF once the side exited
	if err != nil {
		return nil, fmt.Errorf("%s side: %w", spec.Side, err)
	}
	if rerr != nil {
		return nil, fmt.Errorf("%s side: %w", spec.Side, rerr)
	}
	var r sideResult
	lines := bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n"))
	if err := json.Unmarshal(lines[len(lines)-1], &r); err != nil {
		return nil, fmt.Errorf("%s side: unreadable result: %w", spec.Side, err)
	}
	if err := l.result(&r); err != nil {
		return nil, fmt.Errorf("%s side: %w", spec.Side, err)
	}
	return &r, nil
}

// config is the side's one-queue configuration.
func (s *sideSpec) config() (*config.Config, error) {
	tiers := s.Tiers
	if len(tiers) == 0 {
		tiers = defaultTiers
	}
	cfg, err := ConfigTiers(s.Prefix, s.Prefetch, s.Concurrency, tiers)
	if err != nil || s.ImmediateRetries == 0 && base(s.Side) != Shared {
		return cfg, err
	}
	cfg.Queues[0].Retry.ImmediateRetries = s.ImmediateRetries
	if base(s.Side) == Shared {
		// Tiers of its own, named from the side's prefix: declared and
		// deleted with the round, like the others' lanes.
		cfg.Queues[0].Retry.TierQueues = config.TierQueuesShared
		cfg.SharedTiers.Prefix = s.Prefix
	}
	if err := cfg.Complete(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// BrokerPIDEnv, when set to the process id of a broker on this machine
// (its beam.smp), makes the bench print to stderr how much CPU time (user +
// sys, from /proc) the broker used while each side's process ran: the
// broker's share of a drain, which the side's own CPU time leaves out.
const BrokerPIDEnv = "DLXBRIDGE_BENCH_BROKER_PID"

// brokerCPU is the CPU time of the process BrokerPIDEnv names, or -1.
func brokerCPU() time.Duration {
	pid, err := strconv.Atoi(os.Getenv(BrokerPIDEnv))
	if err != nil || pid <= 0 { // unset, or not a pid: no path is built from it
		return -1
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	// Fields after the parenthesised command: state is field 3, utime 14, stime 15.
	_, rest, ok := bytes.Cut(b, []byte(") "))
	if !ok {
		return -1
	}
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		return -1
	}
	var utime, stime int64
	if _, err := fmt.Sscan(f[11]+" "+f[12], &utime, &stime); err != nil {
		return -1
	}
	const clockTick = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / clockTick
}

// brokerVersion is the broker's version from the connection's properties.
func brokerVersion(conn *amqp.Connection) string {
	if v, err := topology.VersionFromProperties(conn.Properties); err == nil {
		return v.String()
	}
	return "unknown"
}

// loadAverage is the one-minute load average, or -1 where unknown.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	var l float64
	if _, err := fmt.Sscan(string(b), &l); err != nil {
		return -1
	}
	return l
}

var numCPU = runtime.NumCPU

// startProfile starts a CPU profile of this side in dir; stop writes it.
func startProfile(dir string, s *sideSpec) (stop func(), err error) {
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%s-%d.pprof", s.Side, s.Scenario, os.Getpid())))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		if h, err := os.Create(strings.TrimSuffix(f.Name(), ".pprof") + ".heap.pprof"); err == nil {
			_ = pprof.Lookup("heap").WriteTo(h, 0)
			h.Close()
		}
	}, nil
}
