package brokertest

import "time"

// StopApp stops the RabbitMQ application on the node (rabbitmqctl
// stop_app) and leaves its Erlang VM running: every connection is closed,
// and nothing listens until StartApp. Only for a private node.
func (n *Node) StopApp() {
	n.t.Helper()
	if out, err := n.ctl(120*time.Second, "stop_app"); err != nil {
		n.t.Fatalf("stop_app on %s: %v\n%s", n.Name, err, out)
	}
}

// StartApp starts the application again after StopApp and waits until the
// node has booted.
func (n *Node) StartApp() {
	n.t.Helper()
	if out, err := n.ctl(120*time.Second, "start_app"); err != nil {
		n.t.Fatalf("start_app on %s: %v\n%s%s", n.Name, err, out, n.logTail())
	}
	if out, err := n.ctl(120*time.Second, "await_startup", "--timeout", "90"); err != nil {
		n.t.Fatalf("%s did not start after start_app: %v\n%s%s", n.Name, err, out, n.logTail())
	}
}

// CloseAllConnections force-closes every client connection on the node
// (rabbitmqctl close_all_connections), telling clients reason. It returns
// the error rather than failing the test, so a caller looping on it from
// another goroutine can report it.
func (n *Node) CloseAllConnections(reason string) error {
	if out, err := n.ctl(120*time.Second, "close_all_connections", reason); err != nil {
		return &ctlError{what: "close_all_connections on " + n.Name, err: err, out: string(out)}
	}
	return nil
}

type ctlError struct {
	what, out string
	err       error
}

func (e *ctlError) Error() string { return e.what + ": " + e.err.Error() + ": " + e.out }
func (e *ctlError) Unwrap() error { return e.err }

// Eval evaluates an Erlang expression on the node (rabbitmqctl eval) and
// returns what it printed, for tests that read the node's own accounting
// (e.g. file_handle_cache:info()).
func (n *Node) Eval(expr string) (string, error) {
	out, err := n.ctl(60*time.Second, "eval", expr)
	return string(out), err
}

// PID is the OS pid of the node's beam process, 0 when it is not running.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pid
}
