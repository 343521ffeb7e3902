package apicheck

import (
	"strings"
	"testing"
)

// layers ranks the public packages: a package may import public packages of
// a lower rank only, so dependencies point one way. Leaves first.
var layers = map[string]int{
	"wire":       0, // header names; the standard library only
	"schemas":    1, // the registry and the gate
	"triage":     1, // pure decisions
	"config":     2, // the file format and defaults; the domain packages' rules
	"quarantine": 3, // the envelope, the record streams and replay; uses config, schemas and triage
	"publisher":  2, // the validating publisher; uses schemas
	"topology":   3, // the declarative model; uses config and triage
	"consumer":   4, // the runtime; uses all of them
}

// Nothing public may import these, whatever its rank.
var forbidden = []string{"internal/brokertest", "cmd/", "examples/"}

// triage decides; it must not know AMQP, Prometheus or OpenTelemetry.
var impure = []string{"github.com/rabbitmq/", "github.com/prometheus/", "go.opentelemetry.io/"}

func TestDependenciesPointOneWay(t *testing.T) {
	t.Parallel()
	for _, p := range publicPackages(t) {
		name := strings.TrimPrefix(p.ImportPath, module+"/")
		rank, ok := layers[name]
		if !ok {
			t.Errorf("%s: a public package without a rank; add it to layers", name)
			continue
		}
		for _, imp := range p.Imports {
			dep, ours := strings.CutPrefix(imp, module+"/")
			if !ours {
				continue
			}
			for _, f := range forbidden {
				if strings.HasPrefix(dep, f) {
					t.Errorf("%s imports %s", name, dep)
				}
			}
			if isInternal(imp) {
				continue // shared plumbing
			}
			if r, ok := layers[dep]; ok && r >= rank {
				t.Errorf("%s (rank %d) imports %s (rank %d): dependencies must point to lower ranks", name, rank, dep, r)
			}
		}
		if name == "triage" {
			for _, dep := range p.Deps {
				for _, bad := range impure {
					if strings.HasPrefix(dep, bad) {
						t.Errorf("triage depends on %s; it must stay pure", dep)
					}
				}
			}
		}
	}
}

// The examples show what a user of the module can write, so they may not
// import anything under internal/ (their tests may use the test kit).
// Nor may the ground floor under internal/ import the app tier.
func TestExamplesAndGroundFloorStayOutOfTheAppTier(t *testing.T) {
	t.Parallel()
	for _, p := range goList(t, "./examples/...", "./internal/...") {
		name := strings.TrimPrefix(p.ImportPath, module+"/")
		for _, imp := range p.Imports {
			dep, ours := strings.CutPrefix(imp, module+"/")
			if !ours {
				continue
			}
			if strings.HasPrefix(name, "examples/") && isInternal(imp) {
				t.Errorf("%s imports %s, which a user of the module cannot", name, dep)
			}
			if strings.HasPrefix(name, "internal/") && strings.HasPrefix(dep, "cmd/") {
				t.Errorf("%s imports %s: the ground floor must not import the app tier", name, dep)
			}
		}
	}
}
