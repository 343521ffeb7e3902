package brokertest

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// StartPrivateNodeWithOpenFiles is StartPrivateNode with the node's soft
// open-files limit set to soft, as Debian's unit sets it (1024), for the
// capacity measurements: the node inherits the soft limit of the process
// that starts it. The test process gets its own limit back at once (the
// hard limit never changes), so such a test must not run in parallel with
// others that start processes.
func StartPrivateNodeWithOpenFiles(t testing.TB, soft uint64) *Node {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = soft
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	node := StartPrivateNode(t)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if l := node.OpenFilesLimit(); !strings.HasPrefix(l, fmt.Sprintf("%d/", soft)) {
		t.Fatalf("the node's open-files limit is %s, want a soft limit of %d", l, soft)
	}
	return node
}

// OpenFilesLimit is the node's soft/hard open-files limit, from /proc.
func (n *Node) OpenFilesLimit() string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", n.PID()))
	if err != nil {
		return "? (" + err.Error() + ")"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Max open files") {
			return strings.Join(strings.Fields(l)[3:5], "/")
		}
	}
	return "?"
}

var fileHandlesMu sync.Mutex

// FileHandles is the node's open descriptors (/proc) and its file-handle
// cache's accounting as the node reports it (3.x: total_used of
// total_limit, sockets_used of sockets_limit).
func (n *Node) FileHandles() string {
	fileHandlesMu.Lock()
	defer fileHandlesMu.Unlock()
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", n.PID()))
	out, err := n.Eval("file_handle_cache:info([total_used, total_limit, sockets_used, sockets_limit]).")
	if err != nil {
		out = "(" + err.Error() + ")"
	}
	return fmt.Sprintf("%d open fds, file_handle_cache %s", len(fds), strings.Join(strings.Fields(out), " "))
}
