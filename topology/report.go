package topology

import (
	"fmt"
	"io"
	"strings"
)

// Kind is the kind of broker object a step or problem is about.
type Kind string

const (
	KindExchange Kind = "exchange"
	KindQueue    Kind = "queue"
	KindBinding  Kind = "binding"
)

// Action is what Apply does (or did) with one object.
type Action string

const (
	// ActionCreate: the object is missing and will be (was) declared.
	ActionCreate Action = "create"
	// ActionUnchanged: the object exists exactly as configured.
	ActionUnchanged Action = "unchanged"
	// ActionConflict: the object exists with different arguments or type;
	// Apply refuses to run and never deletes anything.
	ActionConflict Action = "conflict"
	// ActionEnsure: a binding whose existence AMQP cannot see (no
	// management API); binding is idempotent, so Apply binds it anyway.
	ActionEnsure Action = "ensure"
	// ActionKeep: the queue exists as configured except for a replica
	// count (Diff), which the broker reads only at creation; Apply leaves
	// it as it is.
	ActionKeep Action = "keep"
	// ActionRetired: a per-queue retry exchange or lane of a queue that
	// now retries through the shared tiers (Topology.Retired). Apply
	// leaves it alone: what it holds still returns to its work queue, and
	// `topology delete --retired` removes it once it is empty.
	ActionRetired Action = "retired"
)

// Step is the plan for one object.
type Step struct {
	Kind   Kind     `json:"kind"`
	Object string   `json:"object"`
	Action Action   `json:"action"`
	Diff   *ArgDiff `json:"diff,omitempty"`
	// Note says what a retired object holds and what becomes of it.
	Note string `json:"note,omitempty"`
}

// Summary counts steps by action.
type Summary struct {
	Create    int `json:"create"`
	Unchanged int `json:"unchanged"`
	Conflict  int `json:"conflict"`
	Ensure    int `json:"ensure"`
	Keep      int `json:"keep"`
	Retired   int `json:"retired"`
}

// Plan says, for every exchange, queue and binding of a topology, whether
// Apply creates it, leaves it alone, or refuses because it conflicts.
type Plan struct {
	BrokerVersion string `json:"broker_version"`
	// Applied is true in the report Apply returns after declaring.
	Applied bool `json:"applied"`
	// BindingsChecked is false without the management API: AMQP cannot
	// list bindings, so they are "ensure" rather than create/unchanged.
	BindingsChecked bool `json:"bindings_checked"`
	// ManagementError says why a configured management API was not used.
	ManagementError string `json:"management_error,omitempty"`
	// Replicas is the replica count new queues and streams are declared
	// with (config broker.replicas); 0: the broker's default.
	Replicas int     `json:"replicas"`
	Steps    []Step  `json:"steps"`
	Summary  Summary `json:"summary"`
	// NotChecked says what the plan could not tell, and why.
	NotChecked []string `json:"not_checked,omitempty"`
	// Totals counts everything the topology declares, existing or not.
	Totals Totals `json:"totals"`
}

// Complete reports whether the plan could check everything.
func (p *Plan) Complete() bool { return len(p.NotChecked) == 0 }

func (p *Plan) add(s Step) {
	p.Steps = append(p.Steps, s)
	switch s.Action {
	case ActionCreate:
		p.Summary.Create++
	case ActionUnchanged:
		p.Summary.Unchanged++
	case ActionConflict:
		p.Summary.Conflict++
	case ActionEnsure:
		p.Summary.Ensure++
	case ActionKeep:
		p.Summary.Keep++
	case ActionRetired:
		p.Summary.Retired++
	}
}

// WriteText renders the plan for people: one line per object that is not
// unchanged, then the counts.
func (p *Plan) WriteText(w io.Writer) error {
	var b strings.Builder
	verb := map[Action]string{ActionCreate: "create", ActionConflict: "CONFLICT", ActionEnsure: "bind", ActionKeep: "keep", ActionRetired: "retired"}
	if p.Applied {
		verb = map[Action]string{ActionCreate: "created", ActionEnsure: "bound", ActionKeep: "kept", ActionRetired: "retired"}
	}
	fmt.Fprintf(&b, "broker %s\n", p.BrokerVersion)
	for _, s := range p.Steps {
		if s.Action == ActionUnchanged {
			continue
		}
		line := fmt.Sprintf("  %-9s %s", verb[s.Action], s.Object)
		if s.Diff != nil {
			line += fmt.Sprintf(": %s: want %s, have %s", s.Diff.Arg, s.Diff.Want, s.Diff.Have)
		}
		if s.Note != "" {
			line += ": " + s.Note
		}
		if s.Action == ActionKeep {
			line += " (read at creation only: the queue keeps its members)"
		}
		b.WriteString(line + "\n")
	}
	if !p.Applied {
		writeNotChecked(&b, p.ManagementError, p.NotChecked)
	}
	sum := p.Summary
	switch {
	case p.Applied:
		fmt.Fprintf(&b, "apply: %d created, %d unchanged", sum.Create, sum.Unchanged)
	case sum.Conflict > 0:
		fmt.Fprintf(&b, "plan: %d conflict(s): apply would refuse and declare nothing (conflicting objects are never deleted); %d to create, %d unchanged", sum.Conflict, sum.Create, sum.Unchanged)
	default:
		fmt.Fprintf(&b, "plan: %d to create, %d unchanged", sum.Create, sum.Unchanged)
	}
	if sum.Keep > 0 {
		fmt.Fprintf(&b, ", %d kept with the replica count they were declared with", sum.Keep)
	}
	if sum.Ensure > 0 {
		fmt.Fprintf(&b, ", %d binding(s) ensured (not checkable without the management API)", sum.Ensure)
	}
	if sum.Retired > 0 {
		fmt.Fprintf(&b, "; %d per-queue retry object(s) retired by the move to shared tiers (left as they are; `topology delete --retired` removes each once empty)", sum.Retired)
	}
	b.WriteString("\n")
	if !p.Applied {
		p.Totals.writeText(&b)
		writeReplicas(&b, p.Replicas)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (t Totals) writeText(b *strings.Builder) {
	fmt.Fprintf(b, "totals: %d quorum queues, %d streams, %d exchanges, %d bindings for %d work queue(s)\n", t.QuorumQueues, t.Streams, t.Exchanges, t.Bindings, t.WorkQueues)
	if s := t.Shared; s != nil {
		fmt.Fprintf(b, "  shared tiers %s.*, once per virtual host: %d quorum queues (%d delay tiers, 1 catch-all), %d streams, %d exchanges, %d bindings\n", s.Name, s.QuorumQueues, s.RetryLanes, s.Streams, s.Exchanges, s.Bindings)
	}
	if len(t.PerWorkQueue) > 0 {
		b.WriteString("  each work queue adds:\n")
	}
	for _, w := range t.PerWorkQueue {
		lanes := "retry lanes"
		if w.RetryLanes == 1 {
			lanes = "retry lane"
		}
		fmt.Fprintf(b, "    %s: %d quorum queues (%d %s), %d streams, %d exchanges, %d bindings\n", w.Name, w.QuorumQueues, w.RetryLanes, lanes, w.Streams, w.Exchanges, w.Bindings)
	}
}

// writeReplicas says what replica count new queues get.
func writeReplicas(b *strings.Builder, n int) {
	if n <= 0 {
		b.WriteString("replicas: the broker's default for each new queue and stream (broker.replicas unset)\n")
		return
	}
	fmt.Fprintf(b, "replicas: %d for each new queue (%s) and stream (%s); existing ones keep theirs\n", n, ArgQuorumInitialGroupSize, ArgInitialClusterSize)
}

// Issue is the kind of drift Verify found.
type Issue string

const (
	IssueMissing           Issue = "missing"
	IssueArgument          Issue = "argument differs"
	IssueQueueType         Issue = "wrong queue type"
	IssueExchangeType      Issue = "wrong exchange type"
	IssueProperty          Issue = "property differs"
	IssuePolicy            Issue = "policy overrides"
	IssueUnexpectedBinding Issue = "unexpected binding"
	// IssueCanDrop: a quarantine whose effective settings let the broker
	// drop a message (Arg names the setting, Have its value).
	IssueCanDrop Issue = "can drop messages"
	// IssueBelowQuorum: a quorum queue or stream with fewer members online
	// than a majority of its members: it takes no publish and delivers
	// nothing until enough of them are back.
	IssueBelowQuorum Issue = "below quorum"

	// The issues of notes, which leave a report OK.

	// IssueDeclaredWith: a replica count the queue was declared with
	// differs from the config's; the broker reads it only at creation.
	IssueDeclaredWith Issue = "declared with another replica count"
	// IssueReplicasOffline: some members are offline, a majority online.
	IssueReplicasOffline Issue = "replicas offline"
	// IssueFewerReplicas: fewer members than broker.replicas, though the
	// cluster has the nodes for them.
	IssueFewerReplicas Issue = "fewer replicas than configured"
	// IssuePolicyOutranked: a policy sets a limit (TTL, length, delivery
	// limit) higher than the queue's own argument; the broker applies the
	// lower, the argument, so the policy changes nothing on this queue.
	IssuePolicyOutranked Issue = "policy outranked by the queue's argument"
)

// Problem is one difference between the broker and the config.
type Problem struct {
	Kind   Kind   `json:"kind"`
	Object string `json:"object"`
	Issue  Issue  `json:"issue"`
	// Arg, Want and Have name the differing argument (or property, or
	// policy key) and its two values; "none" means absent.
	Arg  string `json:"arg,omitempty"`
	Want string `json:"want,omitempty"`
	Have string `json:"have,omitempty"`
	// Policy names the policy that overrides an argument.
	Policy string `json:"policy,omitempty"`
}

func (p Problem) String() string {
	s := fmt.Sprintf("%s: %s", p.Object, p.Issue)
	if p.Arg != "" {
		s += fmt.Sprintf(": %s: want %s, have %s", p.Arg, p.Want, p.Have)
	}
	if p.Policy != "" {
		s += fmt.Sprintf(" (set by %s)", p.Policy)
	}
	return s
}

// VerifyReport is what Verify found.
type VerifyReport struct {
	BrokerVersion string `json:"broker_version"`
	// Management is true when the management API was used.
	Management bool `json:"management"`
	// ManagementError says why a configured management API was not used.
	ManagementError string `json:"management_error,omitempty"`
	// Objects is how many exchanges, queues and bindings were checked.
	Objects  int       `json:"objects"`
	Problems []Problem `json:"problems"`
	// Notes are findings that leave the report OK: a replica count other
	// than the one a queue was declared with, replicas offline while a
	// majority is online, fewer replicas than configured.
	Notes []Problem `json:"notes,omitempty"`
	// NotChecked says what could not be checked, and why.
	NotChecked []string `json:"not_checked,omitempty"`
}

// OK reports whether the broker matches the config as far as it was
// checked.
func (r *VerifyReport) OK() bool { return len(r.Problems) == 0 }

// onlyMissing reports whether every problem is a missing object: apply
// fixes all of them, with nothing to delete or change by hand.
func (r *VerifyReport) onlyMissing() bool {
	for _, p := range r.Problems {
		if p.Issue != IssueMissing {
			return false
		}
	}
	return len(r.Problems) > 0
}

// Complete reports whether everything was checked.
func (r *VerifyReport) Complete() bool { return len(r.NotChecked) == 0 }

// WriteText renders the report for people.
func (r *VerifyReport) WriteText(w io.Writer) error {
	var b strings.Builder
	api := "not used"
	if r.Management {
		api = "used"
	}
	fmt.Fprintf(&b, "broker %s (management API %s)\n", r.BrokerVersion, api)
	for _, p := range r.Problems {
		label := "DRIFT"
		if p.Issue == IssueBelowQuorum { // not drift: the cluster's state
			label = "DOWN "
		}
		fmt.Fprintf(&b, "  %s %s\n", label, p)
	}
	for _, p := range r.Notes {
		fmt.Fprintf(&b, "  note  %s\n", p)
	}
	writeNotChecked(&b, r.ManagementError, r.NotChecked)
	switch {
	case r.OK() && r.Complete():
		fmt.Fprintf(&b, "verify: ok, %d objects match the config\n", r.Objects)
	case r.OK():
		fmt.Fprintf(&b, "verify: incomplete: no drift in the %d objects AMQP could check; the rest was not checked (above)\n", r.Objects)
	default:
		fmt.Fprintf(&b, "verify: %d problem(s) in %d objects\n", len(r.Problems), r.Objects)
		if r.onlyMissing() {
			b.WriteString("every problem is a missing object: `dlxbridge topology apply` declares them (`topology plan` shows what it would do)\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeNotChecked lists what a report could not check, after why the
// management API was not used, if it was configured.
func writeNotChecked(b *strings.Builder, mgmtErr string, notChecked []string) {
	if mgmtErr != "" {
		fmt.Fprintf(b, "  management API not used: %s\n", mgmtErr)
	}
	for _, n := range notChecked {
		fmt.Fprintf(b, "  not checked: %s\n", n)
	}
}
