package brokertest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Private nodes are stopped by t.Cleanup, which a test binary that dies
// (a -timeout panic, SIGKILL) never runs: its detached nodes would go on
// holding ports, memory and file handles. So each node is registered in
// nodeRegistry with the pid of the test process that owns it, and the first
// private node a process starts first sweeps the nodes whose owner is gone:
// their beam process is killed and their directory removed.

// nodeRegistry holds one JSON file per private node that may be running.
var nodeRegistry = filepath.Join(os.TempDir(), "dlxbridge_private_nodes")

// nodeEntry is a registered node.
type nodeEntry struct {
	Name    string `json:"name"`
	Owner   int    `json:"owner"`    // the test process's pid
	PidFile string `json:"pid_file"` // where the node writes its beam pid
	Dir     string `json:"dir"`      // removed with the node
}

var sweepOnce sync.Once

// register notes n as owned by this process; the returned func forgets it.
func register(n *Node) (forget func()) {
	sweepOnce.Do(sweepOrphans)
	if err := os.MkdirAll(nodeRegistry, 0o755); err != nil {
		return func() {}
	}
	file := filepath.Join(nodeRegistry, strings.SplitN(n.Name, "@", 2)[0]+".json")
	b, _ := json.Marshal(nodeEntry{Name: n.Name, Owner: os.Getpid(), PidFile: n.pidFile, Dir: n.dir})
	if err := os.WriteFile(file, b, 0o644); err != nil {
		return func() {}
	}
	return func() { _ = os.Remove(file) }
}

// sweepOrphans stops the registered nodes whose owning process is gone.
func sweepOrphans() {
	files, _ := filepath.Glob(filepath.Join(nodeRegistry, "*.json"))
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		var e nodeEntry
		if json.Unmarshal(b, &e) != nil || e.Owner <= 0 {
			_ = os.Remove(file)
			continue
		}
		if alive(e.Owner) {
			continue // another test process's node, in use
		}
		if pid := nodePid(e); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid, 10*time.Second)
		}
		if e.Dir != "" && strings.Contains(e.Dir, string(filepath.Separator)) {
			_ = os.RemoveAll(e.Dir)
		}
		_ = os.Remove(file)
	}
}

// nodePid is the beam pid an orphan's pid file names, 0 unless that process
// is alive and is this node's (a pid reused since is left alone).
func nodePid(e nodeEntry) int {
	b, err := os.ReadFile(e.PidFile)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !alive(pid) {
		return 0
	}
	cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !strings.Contains(string(cmd), strings.SplitN(e.Name, "@", 2)[0]) {
		return 0
	}
	return pid
}
