package sidecar

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/topology"
)

// What --apply logs stays in lines a log pipeline keeps whole, however
// many objects it created: with 100 work queues on the shared tiers one
// line listing them all was 97,650 bytes (Docker's json-file driver splits
// lines at 16 KiB, journald at 48 KiB). Every created object is still
// named.
func TestApplyLogFitsLogLines(t *testing.T) {
	t.Parallel()
	p := &topology.Plan{}
	for i := range 840 {
		p.Steps = append(p.Steps, topology.Step{Action: topology.ActionCreate,
			Object: fmt.Sprintf("queue 't-testworkqueuesunderonerunwithinthefileha-tpofwke0970a.q%03d.quarantine.records'", i)})
	}
	var buf bytes.Buffer
	logApplied(slog.New(slog.NewTextHandler(&buf, nil)), p)
	const maxLine = 8 << 10
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if len(l) > maxLine {
			t.Fatalf("a line of %d bytes (more than %d): %.200s", len(l), maxLine, l)
		}
	}
	for _, s := range p.Steps {
		if !strings.Contains(buf.String(), s.Object) {
			t.Fatalf("%s is not in the log", s.Object)
		}
	}
	if !strings.Contains(buf.String(), "topology applied") || !strings.Contains(buf.String(), "created=840") {
		t.Errorf("no summary:\n%.500s", buf.String())
	}
}
