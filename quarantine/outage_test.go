package quarantine

import (
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/triage"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func win(id string, from, until int) OutageWindow {
	w := OutageWindow{ID: id, Queue: "orders", From: t0.Add(time.Duration(from) * time.Second)}
	if until > 0 {
		w.Until = t0.Add(time.Duration(until) * time.Second)
	}
	return w
}

func outageEvent(kind string, w OutageWindow) Event {
	return Event{Kind: kind, Verified: true, Run: w.ID, Window: &w}
}

func finished(by string, stopped int, ws ...OutageWindow) Event {
	return Event{Kind: EventReplayFinished, Verified: true, By: by, Run: "r", Windows: ws, Counts: map[string]int{"stopped": stopped}}
}

func TestPendingWindows(t *testing.T) {
	a, b := win("a", 10, 20), win("b", 30, 0)
	aStart := a
	aStart.Until = time.Time{}
	cases := []struct {
		name           string
		events         []Event
		ended, ongoing int
	}{
		{"started only: ongoing", []Event{outageEvent(EventOutageStarted, aStart)}, 0, 1},
		{"started and ended: pending", []Event{outageEvent(EventOutageStarted, aStart), outageEvent(EventOutageEnded, a)}, 1, 0},
		{"covered by a finished auto redrive", []Event{outageEvent(EventOutageStarted, aStart), outageEvent(EventOutageEnded, a), finished(AutoBy, 0, a)}, 0, 0},
		{"a stopped redrive leaves it pending", []Event{outageEvent(EventOutageStarted, aStart), outageEvent(EventOutageEnded, a), finished(AutoBy, 1, a)}, 1, 0},
		{"an operator's replay does not cover it", []Event{outageEvent(EventOutageStarted, aStart), outageEvent(EventOutageEnded, a), finished("op@host", 0, a)}, 1, 0},
		{"an end past the covered end reopens it", []Event{outageEvent(EventOutageStarted, aStart), outageEvent(EventOutageEnded, a), finished(AutoBy, 0, a),
			outageEvent(EventOutageEnded, win("a", 10, 25))}, 1, 0},
		{"another queue's window", []Event{outageEvent(EventOutageStarted, OutageWindow{ID: "x", Queue: "other", From: t0})}, 0, 0},
		{"an end without its start (it carries the window)", []Event{outageEvent(EventOutageEnded, a)}, 1, 0},
		{"two windows", []Event{outageEvent(EventOutageStarted, aStart), outageEvent(EventOutageEnded, a), outageEvent(EventOutageStarted, b)}, 1, 1},
	}
	for _, c := range cases {
		ended, ongoing := PendingWindows(c.events, "orders")
		if len(ended) != c.ended || len(ongoing) != c.ongoing {
			t.Errorf("%s: ended %v ongoing %v, want %d and %d", c.name, ended, ongoing, c.ended, c.ongoing)
		}
	}
	// Unverified (forged) windows count for nothing.
	forged := outageEvent(EventOutageStarted, aStart)
	forged.Verified = false
	forgedEnd := outageEvent(EventOutageEnded, a)
	forgedEnd.Verified = false
	if ended, ongoing := PendingWindows([]Event{forged, forgedEnd}, "orders"); len(ended)+len(ongoing) != 0 {
		t.Errorf("forged windows counted: %v %v", ended, ongoing)
	}
	// Ended twice: the later end counts.
	ended, _ := PendingWindows([]Event{outageEvent(EventOutageStarted, aStart), outageEvent(EventOutageEnded, win("a", 10, 25)), outageEvent(EventOutageEnded, a)}, "orders")
	if len(ended) != 1 || !ended[0].Until.Equal(t0.Add(25*time.Second)) {
		t.Errorf("ended twice: %v", ended)
	}
}

func TestInWindows(t *testing.T) {
	ws := []OutageWindow{win("a", 10, 20)}
	rec := func(class triage.Class, at int, mod func(*Record)) *Record {
		r := &Record{ID: "r", Queue: "orders", State: StateOpen,
			Envelope: Envelope{Verified: true, Source: SourceBridge, Class: class, LastFailureAt: t0.Add(time.Duration(at) * time.Second)}}
		if mod != nil {
			mod(r)
		}
		return r
	}
	cases := []struct {
		name string
		r    *Record
		want bool
	}{
		{"transient inside", rec(triage.ClassTransient, 15, nil), true},
		{"timeout inside", rec(triage.ClassTimeout, 20, nil), true},
		{"within the lookback", rec(triage.ClassTransient, 8, nil), true},
		{"before the lookback", rec(triage.ClassTransient, 7, nil), false},
		{"after the end", rec(triage.ClassTransient, 21, nil), false},
		{"permanent", rec(triage.ClassPermanent, 15, nil), false},
		{"schema", rec(triage.ClassSchema, 15, nil), false},
		{"crash-loop", rec(triage.ClassCrashLoop, 15, nil), false},
		{"panic", rec(triage.ClassPanic, 15, nil), false},
		{"broker dead letter", rec(triage.ClassRejected, 15, func(r *Record) { r.Envelope.Source = SourceBroker }), false},
		{"unverified envelope", rec(triage.ClassTransient, 15, func(r *Record) { r.Envelope.Verified = false }), false},
		{"replayed", rec(triage.ClassTransient, 15, func(r *Record) { r.State = StateReplayed }), false},
		{"another queue", rec(triage.ClassTransient, 15, func(r *Record) { r.Queue = "other" }), false},
		{"no payload", rec(triage.ClassTransient, 15, func(r *Record) { r.Envelope.PayloadOmitted = &PayloadOmitted{Bytes: 1} }), false},
	}
	for _, c := range cases {
		if got := inWindows(c.r, "orders", ws, 2*time.Second); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestRampClimbsToItsRate(t *testing.T) {
	rm := ramp{max: 20}
	// 1 in the first second, 2 in the second, 5, 10, then 20 a second.
	want := map[int]time.Duration{0: 0, 1: time.Second, 2: 1500 * time.Millisecond, 3: 2 * time.Second,
		8: 3 * time.Second, 18: 4 * time.Second, 19: 4050 * time.Millisecond, 38: 5 * time.Second}
	for n, d := range want {
		if got := rm.At(n); got != d {
			t.Errorf("At(%d) = %v, want %v", n, got, d)
		}
	}
	// A rate below the first step: evenly paced at it.
	slow := ramp{max: 0.5}
	if slow.At(0) != 0 || slow.At(1) != 2*time.Second || slow.At(3) != 6*time.Second {
		t.Errorf("slow ramp: %v %v %v", slow.At(0), slow.At(1), slow.At(3))
	}
}

func FuzzRamp(f *testing.F) {
	f.Add(20.0, 10)
	f.Add(0.01, 3)
	f.Add(7.5, 100)
	f.Fuzz(func(t *testing.T, rate float64, n int) {
		if !(rate >= MinRate && rate <= 10000) || n < 0 || n > 100000 {
			t.Skip()
		}
		rm := ramp{max: rate}
		prev := rm.At(0)
		if prev != 0 {
			t.Fatalf("the first message waits %v", prev)
		}
		for i := 1; i <= n; i++ {
			at := rm.At(i)
			if at < prev {
				t.Fatalf("At(%d) = %v before At(%d) = %v", i, at, i-1, prev)
			}
			// Never faster than the rate (a microsecond of rounding).
			if gap := at - prev; float64(gap) < float64(time.Second)/rate-1000 {
				t.Fatalf("rate %g: gap %v before message %d", rate, gap, i)
			}
			prev = at
		}
	})
}

func FuzzPendingWindows(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6})
	f.Fuzz(func(t *testing.T, b []byte) {
		// Events built from the bytes: kind, window id, times.
		var events []Event
		for i := 0; i+2 < len(b); i += 3 {
			id := string(rune('a' + b[i]%3))
			w := OutageWindow{ID: id, Queue: "orders", From: t0.Add(time.Duration(b[i+1]%50) * time.Second)}
			switch b[i+2] % 4 {
			case 0:
				events = append(events, outageEvent(EventOutageStarted, w))
			case 1:
				w.Until = w.From.Add(time.Duration(b[i+2]) * time.Second)
				events = append(events, outageEvent(EventOutageEnded, w))
			case 2:
				w.Until = w.From.Add(time.Duration(b[i+2]) * time.Second)
				events = append(events, finished(AutoBy, int(b[i+1]%2), w))
			default:
				events = append(events, Event{Kind: EventReplayed, Verified: true, IDs: []string{id}})
			}
		}
		ended, ongoing := PendingWindows(events, "orders")
		seen := map[string]bool{}
		for _, w := range append(append([]OutageWindow{}, ended...), ongoing...) {
			if seen[w.ID] {
				t.Fatalf("window %s listed twice", w.ID)
			}
			seen[w.ID] = true
			if w.From.IsZero() || w.Queue != "orders" {
				t.Fatalf("bad window %+v", w)
			}
		}
		for _, w := range ended {
			if w.Until.IsZero() {
				t.Fatalf("ended window without an end: %+v", w)
			}
		}
		for _, w := range ongoing {
			if !w.Until.IsZero() {
				t.Fatalf("ongoing window with an end: %+v", w)
			}
		}
	})
}

func TestJobsFromEvents(t *testing.T) {
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ev := func(kind, run string, s int, mod func(*Event)) Event {
		e := Event{Kind: kind, Run: run, At: at(s), By: "op@host", Verified: true, Quarantine: "orders.quarantine"}
		if mod != nil {
			mod(&e)
		}
		return e
	}
	events := []Event{
		ev(EventClaimed, "j1", 0, nil),
		ev(EventReplayStarted, "j1", 1, func(e *Event) {
			e.Counts = map[string]int{"selected": 5, "to_send": 4, "invalid": 1}
		}),
		ev(EventReplayed, "j1", 2, func(e *Event) { e.IDs, e.ToQueue = []string{"r1"}, "orders" }),
		ev(EventReplayed, "j1", 3, func(e *Event) { e.IDs, e.ToQueue = []string{"r2"}, "orders" }),
		ev(EventReplayOutcome, "j1", 4, func(e *Event) { e.IDs, e.Outcome = []string{"r1"}, JobHandled }),
		ev(EventReplayOutcome, "j1", 4, func(e *Event) { e.IDs, e.Outcome = []string{"r3"}, JobQuarantinedAgain }),
		ev(EventReplayed, "j1", 5, func(e *Event) { e.IDs, e.ToQueue = []string{"r3"}, "orders" }),
		// A forged outcome, ignored.
		ev(EventReplayOutcome, "j1", 6, func(e *Event) { e.IDs, e.Outcome, e.Ignored = []string{"r2"}, JobHandled, true }),
		ev(EventReplayFinished, "j1", 7, func(e *Event) {
			e.Counts = map[string]int{"selected": 5, "sent": 3, "published": 3, "stopped": 1}
			e.Stop = ErrCancelled.Error()
		}),
		ev(EventClaimed, "j2", 8, nil),
		ev(EventReplayStarted, "j2", 9, func(e *Event) { e.Counts = map[string]int{"selected": 1, "to_send": 1} }),
		ev(EventClaimed, "p1", 10, nil),
		ev(EventPurged, "p1", 10, func(e *Event) { e.IDs = []string{"r9"} }),
	}
	jobs := jobsOf(events)
	if len(jobs) != 2 || jobs[0].ID != "j2" || jobs[1].ID != "j1" {
		t.Fatalf("jobs: %+v", jobs)
	}
	j := jobs[1]
	if j.State != JobCancelled || j.Selected != 5 || j.ToSend != 4 || j.Sent != 3 || j.Confirmed != 3 || j.Refused != 1 ||
		j.Handled != 1 || j.QuarantinedAgain != 1 || j.Pending != 1 {
		t.Errorf("j1: %+v", j)
	}
	want := map[string]string{"r1": JobHandled, "r2": JobPending, "r3": JobQuarantinedAgain}
	for _, m := range j.Messages {
		if want[m.ID] != m.Outcome {
			t.Errorf("%s: %s, want %s", m.ID, m.Outcome, want[m.ID])
		}
	}
	if jobs[0].State != JobRunning {
		t.Errorf("j2: %s, want running", jobs[0].State)
	}
	if _, err := FindJob(jobs, "j"); err == nil {
		t.Error("a one-letter prefix found a job")
	}
	if got, err := FindJob(jobs, "j1"); err != nil || got.ID != "j1" {
		t.Errorf("FindJob j1: %v %v", got, err)
	}
}

func FuzzJobsOf(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8})
	kinds := []string{EventClaimed, EventReplayStarted, EventReplayed, EventReplayOutcome, EventReplayOutcome,
		EventReplayFinished, EventCancelRequested, EventReplayRefused, EventPurged}
	f.Fuzz(func(t *testing.T, b []byte) {
		var events []Event
		for i := 0; i+2 < len(b); i += 3 {
			e := Event{Kind: kinds[int(b[i])%len(kinds)], Run: string(rune('a' + b[i+1]%3)), At: t0.Add(time.Duration(i) * time.Second),
				Verified: b[i+2]%5 != 0, Ignored: b[i+2]%7 == 0, IDs: []string{string(rune('p' + b[i+2]%4))},
				Counts: map[string]int{"selected": int(b[i+2] % 9), "stopped": int(b[i+1] % 2)}}
			if e.Kind == EventReplayOutcome {
				e.Outcome = []string{JobHandled, JobQuarantinedAgain, "forged"}[b[i+2]%3]
			}
			events = append(events, e)
		}
		seen := map[string]bool{}
		for _, j := range jobsOf(events) {
			if seen[j.ID] {
				t.Fatalf("job %s listed twice", j.ID)
			}
			seen[j.ID] = true
			if j.Handled+j.QuarantinedAgain+j.Pending != len(j.Messages) || j.Confirmed != len(j.Messages) || j.Sent < j.Confirmed {
				t.Fatalf("counts do not add up: %+v", j)
			}
			ids := map[string]bool{}
			for _, m := range j.Messages {
				if ids[m.ID] {
					t.Fatalf("message %s listed twice in %s", m.ID, j.ID)
				}
				ids[m.ID] = true
				if m.Outcome != JobHandled && m.Outcome != JobQuarantinedAgain && m.Outcome != JobPending {
					t.Fatalf("outcome %q", m.Outcome)
				}
			}
			switch j.State {
			case JobRunning, JobDone, JobCancelled, JobStopped:
			default:
				t.Fatalf("state %q", j.State)
			}
		}
	})
}
