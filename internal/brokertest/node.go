package brokertest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Node is a private, throwaway RabbitMQ node for fault tests: it runs beside
// the system broker under its own node name, ports and data directory (all
// in t.TempDir()), so a test may stop, restart or kill it. It is stopped when
// the test ends. Never point fault injection at the shared broker.
type Node struct {
	// Name is the Erlang node name, e.g. dlxfault1a2b3c@localhost.
	Name string
	// URL is the AMQP URL of the node (guest over loopback).
	URL string
	// ManagementURL and PrometheusURL are set when NodeOptions.Plugins
	// enable those plugins.
	ManagementURL, PrometheusURL string

	t       testing.TB
	dir     string   // the node's directory as this process sees it
	root    string   // a root file system the scripts run in (chroot), "" for none
	sbin    string   // directory holding rabbitmq-server and rabbitmqctl (inside root)
	environ []string // environment for both scripts
	pidFile string   // the node writes its OS pid here at boot

	mu       sync.Mutex
	pid      int  // OS pid of the beam process, 0 when not running
	launched bool // a start was issued and not yet followed by a stop or kill

	alarmProbe   *amqp.Connection     // blocked by RaiseMemoryAlarm, until ClearMemoryAlarm
	alarmBlocked <-chan amqp.Blocking // its connection.blocked notifications
}

// sbinCandidates are where the scripts that run a node as the calling user
// live. Debian's /usr/sbin wrappers re-run everything as the rabbitmq user
// (with its HOME and cookie) when called by root, so the scripts they wrap
// come first.
var sbinCandidates = []string{"/usr/lib/rabbitmq/bin"}

func findSbin() string {
	for _, d := range sbinCandidates {
		if isExec(filepath.Join(d, "rabbitmq-server")) && isExec(filepath.Join(d, "rabbitmqctl")) {
			return d
		}
	}
	if p, err := exec.LookPath("rabbitmq-server"); err == nil {
		d := filepath.Dir(p)
		if isExec(filepath.Join(d, "rabbitmqctl")) {
			return d
		}
	}
	return ""
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// StartPrivateNode starts a private node and waits until it accepts AMQP
// connections. Without an installed rabbitmq-server it skips the test, or
// fails it under CI=true (.ci/run installs the server).
func StartPrivateNode(t testing.TB) *Node {
	t.Helper()
	return StartPrivateNodeWith(t, NodeOptions{})
}

// NodeOptions shape a private node.
type NodeOptions struct {
	// Config is added to the node's rabbitmq.conf (lines of the new-style
	// format), e.g. "max_message_size = 65536" for a limit that a test can
	// reach without pushing megabytes. Defaults to none.
	Config string
	// Version4 runs the node from the RabbitMQ 4.x root file system that
	// scripts/rabbitmq4 builds (RABBITMQ4_ROOT, by default
	// /var/cache/dlxbridge/rabbitmq4-trixie), in a chroot, so that a fault
	// test sees 4.x behaviour. Without that root (or without root
	// privileges) the test is skipped, or fails under CI=true. Defaults to
	// false: the system's rabbitmq-server.
	Version4 bool
	// Plugins are enabled at boot. rabbitmq_management and
	// rabbitmq_prometheus get free ports of their own, in
	// Node.ManagementURL and Node.PrometheusURL. Defaults to none.
	Plugins []string
}

// LikeShared returns options for a private node of the same major version
// as the shared broker e runs on: a fault test then covers 3.x and 4.x as
// the suite does (run against each broker in turn).
func LikeShared(e *Env) NodeOptions {
	return NodeOptions{Version4: !strings.HasPrefix(e.ServerVersion, "3.")}
}

// root4 is the 4.x root file system, "" when there is none to run in.
func root4() string {
	root := os.Getenv("RABBITMQ4_ROOT")
	if root == "" {
		root = "/var/cache/dlxbridge/rabbitmq4-trixie"
	}
	if os.Geteuid() != 0 || !isExec(filepath.Join(root, sbinCandidates[0], "rabbitmq-server")) {
		return ""
	}
	if _, err := os.Stat(filepath.Join(root, "proc", "self")); err != nil {
		return "" // scripts/rabbitmq4 start mounts proc, dev and sys
	}
	return root
}

// StartPrivateNodeWith is StartPrivateNode with opts.
func StartPrivateNodeWith(t testing.TB, opts NodeOptions) *Node {
	t.Helper()
	sbin, root := "", ""
	if opts.Version4 {
		if root = root4(); root != "" {
			sbin = sbinCandidates[0]
		}
	} else {
		sbin = findSbin()
	}
	if sbin == "" {
		what := "rabbitmq-server is not installed"
		if opts.Version4 {
			what = "no RabbitMQ 4.x root file system to run in (scripts/rabbitmq4 start builds it; needs root)"
		}
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s under CI=true: the fault tests need it to run a private node", what)
		}
		t.Skipf("%s: the fault tests need it to run a private node", what)
	}
	// In a chroot the node's directory must lie inside the root; inner is
	// how the node names it.
	dir, inner := t.TempDir(), ""
	if root != "" {
		d, err := os.MkdirTemp(filepath.Join(root, "tmp"), "dlxfault-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(d) })
		dir, inner = d, strings.TrimPrefix(d, root)
	} else {
		inner = dir
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	name := "dlxfault" + hex.EncodeToString(r[:]) + "@localhost"
	amqpPort, distPort := freePort(t), freePort(t)
	var mgmtURL, promURL string
	for _, p := range opts.Plugins {
		switch p {
		case "rabbitmq_management":
			port := freePort(t)
			mgmtURL = fmt.Sprintf("http://127.0.0.1:%d", port)
			opts.Config += fmt.Sprintf("\nmanagement.tcp.port = %d\nmanagement.tcp.ip = 127.0.0.1\n", port)
		case "rabbitmq_prometheus":
			port := freePort(t)
			promURL = fmt.Sprintf("http://127.0.0.1:%d", port)
			opts.Config += fmt.Sprintf("\nprometheus.tcp.port = %d\nprometheus.tcp.ip = 127.0.0.1\n", port)
		}
	}
	if err := writeConf(dir, opts.Config); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("["+strings.Join(opts.Plugins, ",")+"].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		// Nothing of the caller's broker settings (nor its HOME, which
		// holds the system node's cookie) may leak into the private node.
		if !strings.HasPrefix(kv, "RABBITMQ_") && !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "ERL_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"HOME="+inner, // rabbitmq-server and rabbitmqctl share the cookie created here
		"RABBITMQ_NODENAME="+name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(amqpPort),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(inner, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(inner, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(inner, "node.pid"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(inner, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(inner, "advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(inner, "enabled_plugins"),
		"RABBITMQ_CONF_ENV_FILE=/dev/null",
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"ERL_CRASH_DUMP="+filepath.Join(inner, "erl_crash.dump"),
	)
	n := &Node{
		pidFile:       filepath.Join(dir, "node.pid"),
		Name:          name,
		URL:           fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", amqpPort),
		ManagementURL: mgmtURL,
		PrometheusURL: promURL,
		t:             t,
		dir:           dir,
		root:          root,
		sbin:          sbin,
		environ:       env,
	}
	forget := register(n)
	t.Cleanup(func() {
		n.cleanup()
		forget()
	})
	n.Start()
	return n
}

// writeConf writes the node's rabbitmq.conf with config added.
func writeConf(dir, config string) error {
	conf := "log.file.level = warning\n"
	if config != "" {
		conf += strings.TrimRight(config, "\n") + "\n"
	}
	return os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o644)
}

// Reconfigure stops the node, replaces what NodeOptions.Config added to its
// rabbitmq.conf with config, and starts it again; its data (queues and
// their messages) is kept. A test can so fill a queue and then lower
// max_message_size under its messages: "rabbitmqctl eval
// 'application:set_env(rabbit, max_message_size, N).'" reaches new channels
// on 3.10.8 but not on 4.0.5 (seen: 4.0.5 kept the limit it booted with).
func (n *Node) Reconfigure(config string) {
	n.t.Helper()
	n.Stop()
	if err := writeConf(n.dir, config); err != nil {
		n.t.Fatal(err)
	}
	n.Start()
}

// freePort asks the kernel for an unused loopback port.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Env returns an Env on this node for t: names, named connections. Nothing
// is deleted at cleanup: the node and its data go away with the test.
func (n *Node) Env(t testing.TB) *Env {
	t.Helper()
	e := &Env{T: t, URL: n.URL, ManagementURL: n.ManagementURL, Prefix: prefixFor(t.Name()), brokerURL: n.URL}
	if v, ok := e.Dial("probe").Properties["version"].(string); ok {
		e.ServerVersion = v
	}
	return e
}

// Start boots the node (first start, or after Stop or Kill; its data is
// kept) and waits until it has started.
func (n *Node) Start() {
	n.t.Helper()
	n.mu.Lock()
	n.launched = true
	n.mu.Unlock()
	// The node writes its pid file at boot; a file left by an earlier run
	// would name a dead process.
	_ = os.Remove(n.pidFile)
	if out, err := n.run(30*time.Second, "rabbitmq-server", "-detached"); err != nil {
		n.t.Fatalf("start %s: %v\n%s%s", n.Name, err, out, n.logTail())
	}
	// await_startup fails at once while the node is not yet registered
	// with epmd; retry it until the deadline.
	// Generous bounds: on a loaded 2-core machine each rabbitmqctl call boots
	// an Erlang VM of its own and can take many seconds.
	deadline := time.Now().Add(120 * time.Second)
	for {
		out, err := n.ctl(60*time.Second, "await_startup", "--timeout", "30")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("node %s did not start: %v\n%s%s", n.Name, err, out, n.logTail())
		}
		time.Sleep(200 * time.Millisecond) // no event to wait on before the node registers
	}
	pid, err := n.osPid()
	if err != nil {
		n.t.Fatalf("pid of node %s: %v", n.Name, err)
	}
	n.mu.Lock()
	n.pid = pid
	n.mu.Unlock()
}

// osPid reads the pid of the node's beam process from the pid file the node
// writes at boot, else asks the node.
func (n *Node) osPid() (int, error) {
	if b, err := os.ReadFile(n.pidFile); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			return pid, nil
		}
	}
	out, err := n.ctl(60*time.Second, "eval", "os:getpid().")
	if err != nil {
		return 0, fmt.Errorf("%v: %s", err, out)
	}
	return strconv.Atoi(strings.Trim(strings.TrimSpace(string(out)), `"`))
}

// Stop shuts the node down cleanly (rabbitmqctl stop) and waits until its
// process is gone; it is killed if it does not exit within 30s.
func (n *Node) Stop() {
	n.t.Helper()
	err := n.stop()
	n.report(err)
	if _, killed := err.(stoppedByKill); err != nil && !killed {
		n.t.FailNow()
	}
}

// Kill crashes the node: SIGKILL to the beam process, no shutdown at all.
func (n *Node) Kill() {
	n.t.Helper()
	n.mu.Lock()
	pid := n.pid
	n.pid, n.launched = 0, false
	n.mu.Unlock()
	if pid == 0 {
		n.t.Fatalf("kill %s: not running", n.Name)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		n.t.Fatalf("kill %s (pid %d): %v", n.Name, pid, err)
	}
	if !waitGone(pid, 10*time.Second) {
		n.t.Fatalf("node %s (pid %d) still alive after SIGKILL", n.Name, pid)
	}
}

func (n *Node) stop() error {
	n.mu.Lock()
	pid, launched := n.pid, n.launched
	n.pid, n.launched = 0, false
	n.mu.Unlock()
	if pid == 0 && launched {
		// A start that failed half-way may have left a node running.
		if p, err := n.osPid(); err == nil {
			pid = p
		}
	}
	if pid == 0 {
		return nil
	}
	// A node with hundreds of quorum queues and streams takes its time
	// to stop on a busy machine (more than 30 s at a load average of 28).
	out, err := n.ctl(120*time.Second, "stop")
	if waitGone(pid, 120*time.Second) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if !waitGone(pid, 10*time.Second) {
		return fmt.Errorf("node %s (pid %d) survives stop and SIGKILL", n.Name, pid)
	}
	return stoppedByKill{fmt.Errorf("node %s did not stop within 120s (killed it): %v %s", n.Name, err, out)}
}

// stoppedByKill is a stop that ended in SIGKILL: the node is gone, so
// nothing is left behind. On a loaded machine a clean stop can take
// minutes; that is worth a line in the log, not a failed test.
type stoppedByKill struct{ error }

// report fails t for a node that may still run, and only logs one that
// had to be killed.
func (n *Node) report(err error) {
	n.t.Helper()
	var killed stoppedByKill
	switch {
	case err == nil:
	case errors.As(err, &killed):
		n.t.Log(err)
	default:
		n.t.Error(err)
	}
}

func (n *Node) cleanup() {
	n.report(n.stop())
	if n.t.Failed() {
		n.t.Logf("private node %s log:%s", n.Name, n.logTail())
	}
}

// waitGone polls until pid has exited (or is a zombie nobody reaps yet).
func waitGone(pid int, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		if !alive(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond) // a process exit of a non-child has no event
	}
}

func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !os.IsNotExist(err) // no /proc: trust kill(0)
	}
	// "pid (comm) S ...": a zombie (Z) holds no ports or files any more.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// ctl runs rabbitmqctl -n <node> args.
func (n *Node) ctl(timeout time.Duration, args ...string) ([]byte, error) {
	return n.run(timeout, "rabbitmqctl", append([]string{"-n", n.Name, "-q"}, args...)...)
}

func (n *Node) run(timeout time.Duration, script string, args ...string) ([]byte, error) {
	// Output goes to a file, not a pipe: a daemon the script leaves behind
	// (the detached node, epmd) would hold a pipe open and stall Wait.
	f, err := os.CreateTemp(n.dir, "cmd-*.out")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	cmd := exec.Command(filepath.Join(n.sbin, script), args...)
	if n.root != "" {
		cmd = exec.Command("chroot", append([]string{n.root, filepath.Join(n.sbin, script)}, args...)...)
	}
	cmd.Env = n.environ
	cmd.Dir = n.dir // erl may drop files (crash dumps) in its working directory (chroot keeps it)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	timer := time.AfterFunc(timeout, func() { _ = cmd.Process.Kill() })
	err = cmd.Wait()
	timer.Stop()
	out, _ := os.ReadFile(f.Name())
	return out, err
}

// logTail returns the last lines of the node's log, for failure messages.
func (n *Node) logTail() string {
	b, err := os.ReadFile(filepath.Join(n.dir, "log", n.Name+".log"))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return "\n" + strings.Join(lines, "\n")
}
