package consumer

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// childConfig writes b's config where a consumer process started by
// startChild reads it, and returns its path.
func childConfig(t *testing.T, b *testBundle) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "child-config.json")
	raw, err := json.Marshal(b.file)
	must(t, err)
	must(t, os.WriteFile(path, raw, 0o600))
	return path
}

// child is a consumer process: this test binary run again, with no test
// and env added (a TestMain hook reads it and runs a runtime), its stderr
// in the test log and its stdout, a line at a time, on lines.
type child struct {
	cmd   *exec.Cmd
	lines chan string
}

func startChild(t *testing.T, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = testWriter{t}
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	c := &child{cmd: cmd, lines: make(chan string, 256)}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			c.lines <- s.Text()
		}
		close(c.lines)
	}()
	return c
}

// stop sends sig (SIGKILL, SIGTERM; 0 for none: the process ends by
// itself), reads what is left of its output, and returns how it ended.
func (c *child) stop(sig syscall.Signal) error {
	if sig != 0 {
		_ = c.cmd.Process.Signal(sig)
	}
	for range c.lines {
	}
	return c.cmd.Wait()
}
