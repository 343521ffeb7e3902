//go:build linux

package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dlxbridge/dlxbridge/cmd/dlxbridge/internal/cli"
)

// openPTY returns a pseudo-terminal's controller and its terminal end.
func openPTY(t *testing.T) (controller, term *os.File) {
	t.Helper()
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	controller = os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	term, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Raw output: the terminal passes "\r" and "\n" unchanged.
	tio, err := unix.IoctlGetTermios(int(term.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	tio.Oflag &^= unix.OPOST
	if err := unix.IoctlSetTermios(int(term.Fd()), unix.TCSETS, tio); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = term.Close(); _ = controller.Close() })
	return controller, term
}

// On a terminal, replay rewrites one progress line after each message
// (count, rate, ETA) and ends it with a newline before the summary; off a
// terminal (every other test) it writes none.
func TestReplayProgressLineOnATerminal(t *testing.T) {
	t.Parallel()
	b, _ := setupQuarantine(t, map[string]int{"fp-a": 4, "fp-b": 1})
	controller, term := openPTY(t)
	seen := make(chan []byte, 1)
	go func() {
		var buf bytes.Buffer
		_, _ = io.Copy(&buf, controller) // ends when the terminal end closes (EIO)
		seen <- buf.Bytes()
	}()
	var out bytes.Buffer
	env := &cli.Env{Stdout: &out, Stderr: term, Getenv: func(k string) string {
		if k == "RABBITMQ_URL" {
			return b.env.URL
		}
		return ""
	}}
	code := cli.Main(context.Background(), []string{"quarantine", "replay", "--fingerprint", "fp-a", "--rate", "20", "--config", b.config}, env)
	_ = term.Close()
	got := string(<-seen)
	if code != cli.ExitOK || !strings.Contains(out.String(), "replayed 4 of 4 selected") {
		t.Fatalf("replay: exit %d\nstdout:\n%s\nterminal:\n%q", code, out.String(), got)
	}
	line := regexp.MustCompile(`\r(\d+)/4 sent  (\d+\.\d)/s  ETA (\S+)   `)
	lines := line.FindAllStringSubmatch(got, -1)
	if len(lines) != 4 {
		t.Fatalf("want 4 progress lines, got %d in %q", len(lines), got)
	}
	for i, m := range lines {
		if m[1] != fmt.Sprint(i+1) {
			t.Errorf("line %d counts %s", i+1, m[1])
		}
		if m[2] == "0.0" {
			t.Errorf("line %d: rate %s", i+1, m[2])
		}
	}
	if last := lines[3][3]; last != "0s" {
		t.Errorf("last line's ETA %s, want 0s", last)
	}
	if !strings.HasSuffix(got, "ETA 0s   \n") {
		t.Errorf("the progress line does not end with a newline: %q", got)
	}
	// Off a terminal: no progress line.
	if _, errOut := b.mustRunAll(t, cli.ExitOK, "quarantine", "replay", "--fingerprint", "fp-b", "--config", b.config); strings.Contains(errOut, "sent  ") {
		t.Errorf("progress line off a terminal: %q", errOut)
	}
}
