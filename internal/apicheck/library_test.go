package apicheck

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/topology"
)

// buildLibrary builds examples/library, a module of its own whose go.mod
// replaces dlxbridge with this checkout, the way another module builds
// against dlxbridge: an exported API that leaks an internal type fails here
// with "use of internal package … not allowed". The build uses the example's
// committed go.mod and go.sum as they are (-mod=readonly, no workspace): a
// dependency change in dlxbridge's go.mod shows up as "updates to go.mod
// needed"; then run `go mod tidy` in examples/library.
func buildLibrary(t *testing.T) (dir, bin string) {
	t.Helper()
	dir = filepath.Join(moduleRoot(t), "examples", "library")
	bin = filepath.Join(t.TempDir(), "library")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS="+os.Getenv("GOFLAGS")+" -mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build in examples/library: %v\n%s", err, out)
	}
	return dir, bin
}

func TestLibraryExampleBuildsFromItsOwnModule(t *testing.T) {
	t.Parallel()
	buildLibrary(t)
}

// The example runs against the broker, from config.yaml and from the same
// configuration built in code: it declares its topology, publishes an
// orders.created v2 and a v1, and exits 0 once the handler has shipped both
// (the v1 one through the upcaster).
func TestLibraryExampleRuns(t *testing.T) {
	t.Parallel()
	dir, bin := buildLibrary(t)
	for _, mode := range []struct{ name, flag string }{{"file", "-in-code=false"}, {"in-code", "-in-code"}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			env := brokertest.Require(t)
			prefix := env.Prefix + "."
			trackLibraryTopology(t, env, filepath.Join(dir, "config.yaml"), prefix)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, mode.flag, "-prefix", prefix, "-for", "60s")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "RABBITMQ_URL="+env.URL)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			if err != nil {
				t.Fatalf("example failed: %v", err)
			}
			for _, want := range []string{
				"shipped order 1d2c3b4a-5e6f-4a7b-8c9d-0e1f2a3b4c5d (key order-v2): 1 line(s), total 12.00 EUR",
				"shipped order 9e8d7c6b-5a4f-4e3d-9c2b-1a0f9e8d7c6b (key order-v1): 1 line(s), total 4.50 EUR",
				"both orders shipped",
			} {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("output lacks %q", want)
				}
			}
		})
	}
}

// trackLibraryTopology registers for cleanup every exchange and queue the
// example declares with prefix, so they go even without a management API.
func trackLibraryTopology(t *testing.T, env *brokertest.Env, file, prefix string) {
	t.Helper()
	cfg, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Queues {
		q := &cfg.Queues[i]
		q.Name = prefix + q.Name
		q.Exchange.Name = prefix + q.Exchange.Name
		q.Quarantine.Queue = prefix + q.Quarantine.Queue
	}
	v, err := topology.ParseBrokerVersion(env.ServerVersion)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Build(cfg, v)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range topo.Exchanges {
		env.TrackExchange(x.Name)
	}
	for _, q := range topo.Queues {
		env.TrackQueue(q.Name)
	}
}

// The README's library section shows the example: every line of each of its
// Go blocks appears in examples/library/main.go, in the same order (the
// program adds flags, output and the name prefix around them). So the README
// shows code that compiles in another module and runs.
func TestReadmeLibrarySectionIsTheExample(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(root, "examples", "library", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlocks(t, string(readme), "## Use it as a library")
	if len(blocks) == 0 {
		t.Fatal(`README has no Go block under "## Use it as a library"`)
	}
	code := lines(string(src))
	for i, block := range blocks {
		at := 0
		for _, l := range lines(block) {
			for at < len(code) && code[at] != l {
				at++
			}
			if at == len(code) {
				t.Errorf("README library block %d: %q is not in examples/library/main.go (or not in this order)", i+1, l)
				break
			}
			at++
		}
	}
}

// goBlocks returns the ```go blocks of the markdown section that starts with
// heading.
func goBlocks(t *testing.T, md, heading string) []string {
	t.Helper()
	start := strings.Index(md, "\n"+heading+"\n")
	if start < 0 {
		t.Fatalf("README has no %q section", heading)
	}
	section := md[start+len(heading)+2:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	var blocks []string
	for {
		_, rest, ok := strings.Cut(section, "```go\n")
		if !ok {
			return blocks
		}
		block, after, ok := strings.Cut(rest, "```")
		if !ok {
			t.Fatal("README: an unclosed ```go block")
		}
		blocks = append(blocks, block)
		section = after
	}
}

// lines returns the non-blank lines of s, trimmed.
func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// The README has a new user declare the top-level config.yaml, then run
// examples/library on the same broker. Had the example derived any name the
// shipped config derives (it used "orders", with other retry lanes), its
// Apply would refuse with a conflict, and the README's second step would
// fail after its first.
func TestLibraryExampleNamesStayApartFromTheShippedConfig(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	names := func(path string) map[string]bool {
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for i := range cfg.Queues {
			for _, n := range cfg.Queues[i].Names(cfg.SharedTiers) {
				out[n.Name] = true
			}
		}
		return out
	}
	shipped := names(filepath.Join(root, "config.yaml"))
	for n := range names(filepath.Join(root, "examples", "library", "config.yaml")) {
		if shipped[n] {
			t.Errorf("examples/library/config.yaml derives %q, as the top-level config.yaml does", n)
		}
	}
}
