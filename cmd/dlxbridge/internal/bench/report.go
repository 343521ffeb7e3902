package bench

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
)

// sideReport is one side of one round, reconciled.
type sideReport struct {
	Seconds     float64 `json:"seconds"`
	Rate        float64 `json:"msgs_per_s"`
	CPUPerMsgUS float64 `json:"cpu_us_per_msg"`
	MaxRSSKB    int64   `json:"peak_rss_kb"`
	// Handled is how many ids a handler succeeded on (raw: acked);
	// Quarantined how many are in the quarantine.
	Handled     int `json:"handled"`
	Quarantined int `json:"quarantined"`
	// Lost ids were neither handled nor quarantined (the first 20 are
	// listed in LostIDs). Misplaced ids ended on the wrong side: a message
	// that must succeed in the quarantine, or one that must be quarantined
	// handled. BadBodies arrived (handler or quarantine) with a body that
	// is not byte for byte the one published.
	Lost      int      `json:"lost"`
	LostIDs   []string `json:"lost_ids,omitempty"`
	Misplaced int      `json:"misplaced"`
	BadBodies int      `json:"bad_bodies"`
	Unknown   int      `json:"unknown"` // deliveries or quarantined messages with no bench id
	// Duplicates are ids handled or quarantined more than once (at-least-
	// once delivery): counted apart, never a loss. Left is how many messages
	// were still in the work queue or a retry lane when the side stopped.
	Duplicates int  `json:"duplicates"`
	Left       int  `json:"left"`
	TimedOut   bool `json:"timed_out,omitempty"`
	// ConfirmWaitMS: see sideResult.
	ConfirmWaitMS float64 `json:"confirm_wait_ms,omitempty"`
	// WritesPerMsg and ReadsPerMsg are the side's write and read system
	// calls per message (see sideResult.Writes); -1 where unknown.
	WritesPerMsg float64 `json:"writes_per_msg"`
	ReadsPerMsg  float64 `json:"reads_per_msg"`
}

func (r *sideReport) failed() bool {
	return r.Lost+r.Misplaced+r.BadBodies+r.Unknown > 0 || r.TimedOut
}

// reconcile reads back what the side left on the broker (the quarantine,
// and anything still in the work queue or a retry lane) and checks every
// id against what the side reported.
func reconcile(conn *amqp.Connection, s *sideSpec, res *sideResult) (*sideReport, error) {
	if len(res.Handled) != s.Count {
		return nil, fmt.Errorf("the %s side reported %d ids, want %d", s.Side, len(res.Handled), s.Count)
	}
	r := &sideReport{
		Seconds: res.Seconds, MaxRSSKB: res.MaxRSSKB, TimedOut: res.TimedOut, ConfirmWaitMS: res.ConfirmWaitMS,
		BadBodies: res.BadBodies, Unknown: res.Unknown,
	}
	if res.Seconds > 0 {
		r.Rate = float64(s.Count) / res.Seconds
	}
	r.CPUPerMsgUS = res.CPUSeconds * 1e6 / float64(s.Count)
	r.WritesPerMsg, r.ReadsPerMsg = perMsg(res.Writes, s.Count), perMsg(res.Reads, s.Count)
	cfg, err := s.config()
	if err != nil {
		return nil, err
	}
	q := &cfg.Queues[0]
	quarantined := make([]int, s.Count)
	err = Drain(conn, q.Quarantine.Queue, func(d *amqp.Delivery) {
		i := Index(d.MessageId)
		if i < 0 || i >= s.Count {
			r.Unknown++
			return
		}
		quarantined[i]++
		if !bytes.Equal(d.Body, Body(i, s.Size, KindOf(s.Scenario, i))) {
			r.BadBodies++
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read the quarantine: %w", err)
	}
	left := make([]int, s.Count)
	for _, n := range q.Names(cfg.SharedTiers) {
		switch {
		case n.Kind != config.KindQueue, n.Role == config.RoleQuarantine,
			n.Role == config.RoleRecordsStream, n.Role == config.RoleEventsStream, // streams: the runtime keeps the intake (KeepQuarantineIntake)
			n.Role == config.RoleSharedCatchAll && n.Name != cfg.SharedTiers.Unrouted():
			continue
		}
		err := Drain(conn, n.Name, func(d *amqp.Delivery) {
			r.Left++
			if i := Index(d.MessageId); i >= 0 && i < s.Count {
				left[i]++
			}
		})
		if err != nil {
			return nil, fmt.Errorf("read what is left in %s: %w", n.Name, err)
		}
	}
	tally(r, s, res.Handled, quarantined, left)
	return r, nil
}

// perMsg is n ÷ count, or -1 when n is unknown (-1).
func perMsg(n int64, count int) float64 {
	if n < 0 || count <= 0 {
		return -1
	}
	return float64(n) / float64(count)
}

// tally checks every id: handled[i] successes (raw: acks), quarantined[i]
// copies in the quarantine, left[i] copies still queued.
func tally(r *sideReport, s *sideSpec, handled []byte, quarantined, left []int) {
	for i := range s.Count {
		h, qn := int(handled[i]), quarantined[i]
		if h > 0 {
			r.Handled++
		}
		if qn > 0 {
			r.Quarantined++
		}
		if h == 0 && qn == 0 {
			r.Lost++
			if len(r.LostIDs) < 20 {
				r.LostIDs = append(r.LostIDs, ID(i))
			}
		}
		if h+qn+left[i] > 1 {
			r.Duplicates++
		}
		wantQ := s.parks() && KindOf(s.Scenario, i).Quarantined()
		if (wantQ && h > 0) || (!wantQ && qn > 0) {
			r.Misplaced++
		}
	}
}

// Report is a whole run: what the JSON line holds.
type Report struct {
	Broker      string `json:"broker"`
	Count       int    `json:"count"`
	Size        int    `json:"size"`
	Prefetch    int    `json:"prefetch"`
	Concurrency int    `json:"concurrency"`
	// ImmediateRetries is the bridge's --immediate-retries.
	ImmediateRetries int              `json:"immediate_retries"`
	Rounds           int              `json:"rounds"`
	CPUs             int              `json:"cpus"`
	Load1            float64          `json:"load1"` // one-minute load average when the run ended
	Scenarios        []scenarioReport `json:"scenarios"`
	Reconciled       bool             `json:"reconciled"`
	// Error is why the run stopped before its last round, if it did: then
	// Reconciled is false, whatever the rounds that ran showed.
	Error      string `json:"error,omitempty"`
	Lost       int    `json:"lost"`
	Misplaced  int    `json:"misplaced"`
	BadBodies  int    `json:"bad_bodies"`
	Duplicates int    `json:"duplicates"`
	// StormVsClean is the bridge's median storm rate ÷ its median clean
	// rate, when both ran: how much of its speed a storm of failures costs.
	StormVsClean float64 `json:"bridge_storm_vs_clean,omitempty"`
	// FloorStormVsClean is the same for the floor side (--floor): what a
	// storm costs a consumer that does the least and loses nothing.
	FloorStormVsClean float64 `json:"floor_storm_vs_clean,omitempty"`

	opts *Options
}

// scenarioReport summarises one scenario over its rounds.
type scenarioReport struct {
	Scenario string `json:"scenario"`
	// Ratios are bridge ÷ raw message rates, one per round; Ratio is their
	// median. CPURatio is the bridge's median CPU per message ÷ raw's.
	Ratio    float64     `json:"ratio"`
	Ratios   []float64   `json:"ratios"`
	CPURatio float64     `json:"cpu_ratio"`
	Raw      sideSummary `json:"raw"`
	Bridge   sideSummary `json:"bridge"`
	// Floor is the floor side's summary (--floor), and BridgeVsFloor the
	// bridge's median rate ÷ the floor's.
	Floor         *sideSummary `json:"floor,omitempty"`
	BridgeVsFloor float64      `json:"bridge_vs_floor,omitempty"`
	// Shared is the shared side's summary (--shared-tiers); SharedRatios
	// are its rate ÷ the bridge's, one per round, and SharedVsBridge
	// their median.
	Shared         *sideSummary `json:"shared,omitempty"`
	SharedRatios   []float64    `json:"shared_ratios,omitempty"`
	SharedVsBridge float64      `json:"shared_vs_bridge,omitempty"`
	// Sides summarises every side that ran, by name, with its figures
	// per round beside the medians.
	Sides map[string]*sideSummary `json:"sides"`
	// Versus reads each runtime side (bridge, shared, and their -c1)
	// against a hand-written reference of the same rounds: in a storm the
	// fair floor (the bridge's own way of retrying, done by hand), clean
	// the floor. Ratios of medians.
	Versus map[string]*versus `json:"versus,omitempty"`
	rounds []*roundResult     // for the text table
}

type sideSummary struct {
	Rate        float64 `json:"msgs_per_s"`     // median over rounds
	CPUPerMsgUS float64 `json:"cpu_us_per_msg"` // median over rounds
	MaxRSSKB    int64   `json:"peak_rss_kb"`    // the largest of the rounds
	// ConfirmWaitMS is the median over rounds of the mean wait for a
	// parked or retried copy's confirm (sides that publish them).
	ConfirmWaitMS float64 `json:"confirm_wait_ms,omitempty"`
	// Rates and CPUPerMsgUSRounds are the side's figures in each round,
	// in round order (in Sides only).
	Rates             []float64 `json:"msgs_per_s_rounds,omitempty"`
	CPUPerMsgUSRounds []float64 `json:"cpu_us_per_msg_rounds,omitempty"`
	// WritesPerMsgRounds and ReadsPerMsgRounds are its write and read
	// system calls per message in each round (in Sides only).
	WritesPerMsgRounds []float64 `json:"writes_per_msg_rounds,omitempty"`
	ReadsPerMsgRounds  []float64 `json:"reads_per_msg_rounds,omitempty"`
}

// versus is a side's median CPU per message and rate, each ÷ the
// reference side's.
type versus struct {
	Ref  string  `json:"ref"`
	CPU  float64 `json:"cpu"`
	Rate float64 `json:"rate"`
}

func newReport(o *Options, conn *amqp.Connection) *Report {
	concurrency := o.Concurrency
	if concurrency == 0 {
		if cfg, err := Config("x", o.Prefetch, 0); err == nil {
			concurrency = cfg.Queues[0].Consumer.Concurrency
		}
	}
	return &Report{Broker: brokerVersion(conn), Count: o.Count, Size: o.Size, Prefetch: o.Prefetch,
		Concurrency: concurrency, ImmediateRetries: o.ImmediateRetries, Rounds: o.Rounds, CPUs: numCPU(), Reconciled: true, opts: o}
}

func (rep *Report) add(scenario string, r *roundResult) {
	i := slices.IndexFunc(rep.Scenarios, func(s scenarioReport) bool { return s.Scenario == scenario })
	if i < 0 {
		rep.Scenarios = append(rep.Scenarios, scenarioReport{Scenario: scenario})
		i = len(rep.Scenarios) - 1
	}
	rep.Scenarios[i].rounds = append(rep.Scenarios[i].rounds, r)
	for _, s := range r.Sides {
		rep.Lost += s.Lost
		rep.Misplaced += s.Misplaced
		rep.BadBodies += s.BadBodies + s.Unknown
		rep.Duplicates += s.Duplicates
		if s.failed() {
			rep.Reconciled = false
		}
	}
}

// finish computes medians and ratios.
func (rep *Report) finish() {
	rep.Load1 = loadAverage()
	for i := range rep.Scenarios {
		sc := &rep.Scenarios[i]
		var raw, bridge, rawCPU, bridgeCPU, bridgeWait, floorWait []float64
		sc.Ratios = nil
		for _, r := range sc.rounds {
			a, b := r.Sides[Raw], r.Sides[Bridge]
			raw, rawCPU = append(raw, a.Rate), append(rawCPU, a.CPUPerMsgUS)
			bridge, bridgeCPU = append(bridge, b.Rate), append(bridgeCPU, b.CPUPerMsgUS)
			if b.ConfirmWaitMS > 0 {
				bridgeWait = append(bridgeWait, b.ConfirmWaitMS)
			}
			sc.Raw.MaxRSSKB = max(sc.Raw.MaxRSSKB, a.MaxRSSKB)
			sc.Bridge.MaxRSSKB = max(sc.Bridge.MaxRSSKB, b.MaxRSSKB)
			if a.Rate > 0 {
				sc.Ratios = append(sc.Ratios, round3(b.Rate/a.Rate))
			}
		}
		sc.Raw.Rate, sc.Bridge.Rate = round3(median(raw)), round3(median(bridge))
		sc.Raw.CPUPerMsgUS, sc.Bridge.CPUPerMsgUS = round3(median(rawCPU)), round3(median(bridgeCPU))
		sc.Bridge.ConfirmWaitMS = round3(median(bridgeWait))
		sc.Ratio = round3(median(sc.Ratios))
		if sc.Raw.CPUPerMsgUS > 0 {
			sc.CPURatio = round3(sc.Bridge.CPUPerMsgUS / sc.Raw.CPUPerMsgUS)
		}
		sc.Floor, sc.BridgeVsFloor = nil, 0
		var floor, floorCPU []float64
		var floorRSS int64
		for _, r := range sc.rounds {
			if f := r.Sides[Floor]; f != nil {
				floor, floorCPU = append(floor, f.Rate), append(floorCPU, f.CPUPerMsgUS)
				floorRSS = max(floorRSS, f.MaxRSSKB)
				if f.ConfirmWaitMS > 0 {
					floorWait = append(floorWait, f.ConfirmWaitMS)
				}
			}
		}
		if len(floor) > 0 {
			sc.Floor = &sideSummary{Rate: round3(median(floor)), CPUPerMsgUS: round3(median(floorCPU)), MaxRSSKB: floorRSS,
				ConfirmWaitMS: round3(median(floorWait))}
			if sc.Floor.Rate > 0 {
				sc.BridgeVsFloor = round3(sc.Bridge.Rate / sc.Floor.Rate)
			}
		}
	}
	for i := range rep.Scenarios {
		rep.Scenarios[i].finishShared()
		rep.Scenarios[i].finishSides()
	}
	rep.StormVsClean = stormVsClean(rep.Scenarios, func(sc *scenarioReport) float64 { return sc.Bridge.Rate })
	rep.FloorStormVsClean = stormVsClean(rep.Scenarios, func(sc *scenarioReport) float64 {
		if sc.Floor == nil {
			return 0
		}
		return sc.Floor.Rate
	})
}

// finishShared summarises the shared side's rounds, if it ran, beside the
// bridge's of the same rounds.
func (sc *scenarioReport) finishShared() {
	sc.Shared, sc.SharedRatios, sc.SharedVsBridge = nil, nil, 0
	var rate, cpu, wait []float64
	var rss int64
	for _, r := range sc.rounds {
		sh, b := r.Sides[Shared], r.Sides[Bridge]
		if sh == nil {
			continue
		}
		rate, cpu = append(rate, sh.Rate), append(cpu, sh.CPUPerMsgUS)
		rss = max(rss, sh.MaxRSSKB)
		if sh.ConfirmWaitMS > 0 {
			wait = append(wait, sh.ConfirmWaitMS)
		}
		if b != nil && b.Rate > 0 {
			sc.SharedRatios = append(sc.SharedRatios, round3(sh.Rate/b.Rate))
		}
	}
	if len(rate) == 0 {
		return
	}
	sc.Shared = &sideSummary{Rate: round3(median(rate)), CPUPerMsgUS: round3(median(cpu)), MaxRSSKB: rss, ConfirmWaitMS: round3(median(wait))}
	sc.SharedVsBridge = round3(median(sc.SharedRatios))
}

// finishSides summarises every side that ran, and reads the runtime's
// sides against their reference (see scenarioReport.Versus).
func (sc *scenarioReport) finishSides() {
	sc.Sides, sc.Versus = map[string]*sideSummary{}, nil
	for _, r := range sc.rounds {
		for name, s := range r.Sides {
			sum := sc.Sides[name]
			if sum == nil {
				sum = &sideSummary{}
				sc.Sides[name] = sum
			}
			sum.Rates = append(sum.Rates, round3(s.Rate))
			sum.CPUPerMsgUSRounds = append(sum.CPUPerMsgUSRounds, round3(s.CPUPerMsgUS))
			sum.WritesPerMsgRounds = append(sum.WritesPerMsgRounds, round3(s.WritesPerMsg))
			sum.ReadsPerMsgRounds = append(sum.ReadsPerMsgRounds, round3(s.ReadsPerMsg))
			sum.MaxRSSKB = max(sum.MaxRSSKB, s.MaxRSSKB)
		}
	}
	for name, sum := range sc.Sides {
		var wait []float64
		for _, r := range sc.rounds {
			if s := r.Sides[name]; s != nil && s.ConfirmWaitMS > 0 {
				wait = append(wait, s.ConfirmWaitMS)
			}
		}
		sum.Rate, sum.CPUPerMsgUS = round3(median(sum.Rates)), round3(median(sum.CPUPerMsgUSRounds))
		sum.ConfirmWaitMS = round3(median(wait))
	}
	ref := Floor
	if sc.Scenario == Storm {
		ref = Fair
	}
	f := sc.Sides[ref]
	if f == nil || f.Rate <= 0 || f.CPUPerMsgUS <= 0 {
		return
	}
	sc.Versus = map[string]*versus{}
	for _, name := range []string{Bridge, Shared, Bridge + C1, Shared + C1} {
		if s := sc.Sides[name]; s != nil {
			sc.Versus[name] = &versus{Ref: ref, CPU: round3(s.CPUPerMsgUS / f.CPUPerMsgUS), Rate: round3(s.Rate / f.Rate)}
		}
	}
}

// stormVsClean is a side's storm rate ÷ its clean rate, or 0 unless both
// ran.
func stormVsClean(scs []scenarioReport, rate func(*scenarioReport) float64) float64 {
	var clean, storm float64
	for i := range scs {
		switch scs[i].Scenario {
		case Clean:
			clean = rate(&scs[i])
		case Storm:
			storm = rate(&scs[i])
		}
	}
	if clean > 0 && storm > 0 {
		return round3(storm / clean)
	}
	return 0
}

// sideNames are the sides a round ran, in a fixed order.
func sideNames(r *roundResult) []string {
	var names []string
	for _, n := range []string{Raw, Floor, Fair, Bridge, Bridge + C1, Shared, Shared + C1} {
		if r.Sides[n] != nil {
			names = append(names, n)
		}
	}
	return names
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

func round3(f float64) float64 {
	if f >= 100 {
		return float64(int64(f + 0.5))
	}
	return float64(int64(f*1000+0.5)) / 1000
}

// mismatch says what failed reconciliation, side by side.
func (rep *Report) mismatch() string {
	var parts []string
	for _, sc := range rep.Scenarios {
		for _, r := range sc.rounds {
			for _, name := range sideNames(r) {
				s := r.Sides[name]
				if !s.failed() {
					continue
				}
				p := fmt.Sprintf("%s round %d %s: %d lost %v, %d misplaced, %d bad bodies, %d unknown ids", sc.Scenario, r.Round, name, s.Lost, s.LostIDs, s.Misplaced, s.BadBodies, s.Unknown)
				if s.TimedOut {
					p += fmt.Sprintf(", gave up after %s without progress", rep.opts.Idle)
				}
				parts = append(parts, p)
			}
		}
	}
	return strings.Join(parts, "; ")
}

// writeText prints the rounds, then the summary per scenario.
func (rep *Report) writeText(w io.Writer) {
	fmt.Fprintf(w, "dlxbridge bench: RabbitMQ %s, %d messages × %d B per side and round, prefetch %d, bridge concurrency %d, %d round(s), %d CPUs, load %.2f\n\n",
		rep.Broker, rep.Count, rep.Size, rep.Prefetch, rep.Concurrency, rep.Rounds, rep.CPUs, rep.Load1)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tround\tside\tmsg/s\tseconds\tCPU µs/msg\twrites/msg\treads/msg\tpeak RSS MiB\thandled\tquarantined\tlost\tduplicates\t")
	for _, sc := range rep.Scenarios {
		for _, r := range sc.rounds {
			for _, name := range sideNames(r) {
				s := r.Sides[name]
				fmt.Fprintf(tw, "%s\t%d\t%s\t%.0f\t%.2f\t%.1f\t%.2f\t%.2f\t%.1f\t%d\t%d\t%d\t%d\t\n", sc.Scenario, r.Round, name,
					s.Rate, s.Seconds, s.CPUPerMsgUS, s.WritesPerMsg, s.ReadsPerMsg, float64(s.MaxRSSKB)/1024, s.Handled, s.Quarantined, s.Lost, s.Duplicates)
			}
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\traw msg/s\tbridge msg/s\tbridge÷raw\tper round\tCPU µs/msg raw\tbridge\t÷\tpeak RSS MiB raw\tbridge\t")
	for _, sc := range rep.Scenarios {
		var ratios []string
		for _, r := range sc.Ratios {
			ratios = append(ratios, fmt.Sprintf("%.2f", r))
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.2f\t%s\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t\n", sc.Scenario, sc.Raw.Rate, sc.Bridge.Rate, sc.Ratio,
			strings.Join(ratios, " "), sc.Raw.CPUPerMsgUS, sc.Bridge.CPUPerMsgUS, sc.CPURatio,
			float64(sc.Raw.MaxRSSKB)/1024, float64(sc.Bridge.MaxRSSKB)/1024)
	}
	_ = tw.Flush()
	if rep.StormVsClean > 0 {
		fmt.Fprintf(w, "the bridge settles a storm at %.2f× its clean rate\n", rep.StormVsClean)
	}
	if rep.FloorStormVsClean > 0 {
		fmt.Fprintf(w, "the floor (hand-written, the least failure handling that loses nothing) settles a storm at %.2f× its clean rate\n", rep.FloorStormVsClean)
	}
	for _, sc := range rep.Scenarios {
		if sc.Floor != nil {
			fmt.Fprintf(w, "%s: floor %.0f msg/s, %.1f CPU µs/msg; the bridge's rate is %.2f× the floor's\n", sc.Scenario, sc.Floor.Rate, sc.Floor.CPUPerMsgUS, sc.BridgeVsFloor)
		}
		if sc.Shared != nil {
			var ratios []string
			for _, r := range sc.SharedRatios {
				ratios = append(ratios, fmt.Sprintf("%.2f", r))
			}
			fmt.Fprintf(w, "%s: on shared delay tiers the bridge ran at %.0f msg/s, %.1f CPU µs/msg: %.2f× its rate on per-queue lanes (per round: %s)\n",
				sc.Scenario, sc.Shared.Rate, sc.Shared.CPUPerMsgUS, sc.SharedVsBridge, strings.Join(ratios, " "))
		}
		if sc.Bridge.ConfirmWaitMS > 0 {
			fmt.Fprintf(w, "%s: a retry or quarantine copy waited %.1f ms for the broker's confirm (bridge, mean)", sc.Scenario, sc.Bridge.ConfirmWaitMS)
			if sc.Floor != nil && sc.Floor.ConfirmWaitMS > 0 {
				fmt.Fprintf(w, ", %.1f ms (floor)", sc.Floor.ConfirmWaitMS)
			}
			fmt.Fprintln(w, "; its delivery holds prefetch meanwhile")
		}
	}
	for _, sc := range rep.Scenarios {
		for _, name := range []string{Bridge, Bridge + C1, Shared, Shared + C1} {
			if v := sc.Versus[name]; v != nil {
				fmt.Fprintf(w, "%s: %s ÷ %s: CPU per message %.2f×, rate %.2f×\n", sc.Scenario, name, v.Ref, v.CPU, v.Rate)
			}
		}
	}
	fmt.Fprintln(w)
	if rep.Error != "" {
		fmt.Fprintf(w, "NOT COMPLETE: %s; only the rounds above ran\n", rep.Error)
	} else if rep.Reconciled {
		fmt.Fprintf(w, "reconciled: every id handled (raw: acked) or quarantined, bodies as published (quarantined: byte for byte; handled: length and CRC-32C); 0 lost, %d duplicates (at-least-once, not losses)\n", rep.Duplicates)
	} else {
		fmt.Fprintf(w, "NOT RECONCILED: %d lost, %d misplaced, %d bad bodies; %d duplicates\n", rep.Lost, rep.Misplaced, rep.BadBodies, rep.Duplicates)
	}
	fmt.Fprintln(w, "medians over rounds; msg/s from the first delivery (raw) or handler call (bridge) to the last settlement, connection setup excluded; CPU is each side's own process (user+sys), peak RSS its process's maximum.")
}
