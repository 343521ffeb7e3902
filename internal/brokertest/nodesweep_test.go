package brokertest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// A node whose test process died (no t.Cleanup ran) is killed and its
// directory removed by the next process's sweep; a node whose owner lives,
// and a process that merely reuses a dead node's pid, are left alone.
func TestSweepStopsOrphanedPrivateNodes(t *testing.T) {
	// Not parallel: it sweeps the registry the other tests register in.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Skipf("no true(1): %v", err)
	}
	deadOwner := dead.Process.Pid

	// A stand-in for a detached beam process: its command line names the node.
	beam := exec.Command("sh", "-c", "exec -a dlxfaultsweeptest sleep 60")
	if err := beam.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = beam.Wait(); close(exited) }()
	t.Cleanup(func() { _ = beam.Process.Kill() })
	// Another process that does not name the node.
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })

	write := func(name string, owner, pid int) (file, dir string) {
		dir = t.TempDir()
		pidFile := filepath.Join(dir, "node.pid")
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(nodeRegistry, 0o755); err != nil {
			t.Fatal(err)
		}
		file = filepath.Join(nodeRegistry, name+".json")
		b, _ := json.Marshal(nodeEntry{Name: name + "@localhost", Owner: owner, PidFile: pidFile, Dir: dir})
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(file) })
		return file, dir
	}
	orphanFile, orphanDir := write("dlxfaultsweeptest", deadOwner, beam.Process.Pid)
	ownedFile, ownedDir := write("dlxfaultsweepowned", os.Getpid(), beam.Process.Pid)
	reusedFile, _ := write("dlxfaultsweepreused", deadOwner, other.Process.Pid)

	sweepOrphans()

	// The sweep waits until the pid is gone, which is when the goroutine's
	// Wait reaps it; its close of exited may come a moment after (CI saw
	// that moment once).
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the orphaned node's process is still running after the sweep")
	}
	if _, err := os.Stat(orphanDir); !os.IsNotExist(err) {
		t.Errorf("the orphan's directory is still there (%v)", err)
	}
	if _, err := os.Stat(orphanFile); !os.IsNotExist(err) {
		t.Errorf("the orphan's registry entry is still there (%v)", err)
	}
	if _, err := os.Stat(ownedFile); err != nil {
		t.Errorf("a live owner's entry was removed: %v", err)
	}
	if _, err := os.Stat(ownedDir); err != nil {
		t.Errorf("a live owner's directory was removed: %v", err)
	}
	if _, err := os.Stat(reusedFile); !os.IsNotExist(err) {
		t.Errorf("a dead owner's entry whose pid was reused stays (%v)", err)
	}
	if !alive(other.Process.Pid) {
		t.Error("a process reusing a dead node's pid was killed")
	}
}
