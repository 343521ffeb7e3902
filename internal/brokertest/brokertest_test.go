package brokertest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
	"github.com/dlxbridge/dlxbridge/publisher"
	"github.com/dlxbridge/dlxbridge/topology"
)

// method builds an AMQP method frame on channel 1.
func method(class, id uint16, args ...[]byte) []byte {
	payload := binary.BigEndian.AppendUint16(nil, class)
	payload = binary.BigEndian.AppendUint16(payload, id)
	for _, a := range args {
		payload = append(payload, a...)
	}
	return frame(frameMethod, payload)
}

func frame(typ byte, payload []byte) []byte {
	f := []byte{typ, 0, 1}
	f = binary.BigEndian.AppendUint32(f, uint32(len(payload)))
	return append(append(f, payload...), 0xCE)
}

func str(s string) []byte { return append([]byte{byte(len(s))}, s...) }

var (
	ticket   = []byte{0, 0}
	noTable  = []byte{0, 0, 0, 0}
	passive  = []byte{1}
	durable  = []byte{2}
	protocol = []byte("AMQP\x00\x00\x09\x01")
)

func TestScanFramesRecordsDeclaresAndPassesBytesThrough(t *testing.T) {
	t.Parallel()
	var in bytes.Buffer
	in.Write(protocol)
	in.Write(method(50, 10, ticket, str("t-a.work"), durable, noTable))                 // queue.declare
	in.Write(method(50, 10, ticket, str("t-a.passive"), passive, noTable))              // passive: declares nothing
	in.Write(method(50, 10, ticket, str(""), durable, noTable))                         // server-named
	in.Write(method(40, 10, ticket, str("t-a.ex"), str("topic"), durable, noTable))     // exchange.declare
	in.Write(method(40, 10, ticket, str("amq.topic"), str("topic"), passive, noTable))  // passive
	in.Write(method(60, 40, ticket, str("t-a.ex"), str("k"), []byte{0}))                // basic.publish
	in.Write(frame(2, bytes.Repeat([]byte{0}, 14)))                                     // content header
	in.Write(frame(3, method(50, 10, ticket, str("t-a.in-a-body"), durable, noTable)))  // a body that looks like a declare
	in.Write(frame(3, bytes.Repeat([]byte("x"), 200_000)))                              // a body over the peek size
	in.Write(method(50, 40, ticket, str("t-a.work"), []byte{0}))                        // queue.delete
	in.Write(method(40, 10, ticket, str("t-b.ex2"), str("direct"), []byte{0}, noTable)) // after a large frame
	want := slices.Clone(in.Bytes())

	var got []object
	var out bytes.Buffer
	err := scanFrames(&out, &in, func(k kind, name string) { got = append(got, object{k, name}) })
	if !errors.Is(err, io.EOF) {
		t.Fatalf("scanFrames: %v, want EOF at the end of the stream", err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Errorf("the relayed stream differs from the client's (%d bytes, want %d)", out.Len(), len(want))
	}
	wantObjects := []object{{queue, "t-a.work"}, {exchange, "t-a.ex"}, {exchange, "t-b.ex2"}}
	if !slices.Equal(got, wantObjects) {
		t.Errorf("recorded %v, want %v", got, wantObjects)
	}
}

func TestParseDeclareIgnoresTruncatedMethods(t *testing.T) {
	t.Parallel()
	whole := method(40, 10, ticket, str("t-a.ex"), str("topic"), durable, noTable)
	payload := whole[frameHeaderLen : len(whole)-1]
	for n := range len(payload) - len(noTable) {
		if _, _, ok := parseDeclare(payload[:n]); ok {
			t.Errorf("a declare cut at %d bytes was recorded", n)
		}
	}
}

func TestDialGivesUpOnASilentBroker(t *testing.T) {
	t.Parallel()
	// Accepts the TCP connection and never answers the AMQP handshake, like
	// a broker whose file-handle cache is exhausted.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			held <- c
		}
	}()
	defer func() {
		select {
		case c := <-held:
			c.Close()
		default:
		}
	}()
	start := time.Now()
	_, err = dialWithin("amqp://guest:guest@"+ln.Addr().String()+"/", "silent", 300*time.Millisecond)
	if err == nil {
		t.Fatal("dial succeeded against a broker that never answers")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("dial gave up after %v, want about 300ms", took)
	}
}

// With RABBITMQ_URL unset, a broker at the CLI's default address is used
// before any container.
func TestLocateTriesTheDefaultAddressFirst(t *testing.T) {
	t.Setenv("RABBITMQ_URL", "")
	t.Setenv("DLXBRIDGE_NO_DOCKER", "1")
	conn, err := dialWithin(amqpx.DefaultURL, "dlxbridge-test/default-check", defaultProbeTimeout)
	answers := err == nil
	if answers {
		conn.Close()
	}
	b := locate()
	if answers && b.url != amqpx.DefaultURL {
		t.Fatalf("a broker answers at %s, but the harness chose %q (%s)", amqpx.DefaultURL, b.url, b.skip)
	}
	if !answers && b.url != "" {
		t.Fatalf("no broker answers at %s, yet the harness chose %q", amqpx.DefaultURL, b.url)
	}
}

// The harness itself, on a private node without the management plugin:
// whatever a test declares, by a raw channel or by code that dials Env.URL
// itself (here the CLI's topology apply), is gone when the test ends; and a
// run that died before its cleanup is swept by the next one.
func TestNothingLeftWithoutManagement(t *testing.T) {
	t.Parallel()
	node := StartPrivateNode(t)
	before := listOnNode(t, node)

	var seen []string
	t.Run("declare", func(t *testing.T) {
		root := t.TempDir()
		// No management API: StartPrivateNode enables no plugins, and the
		// one of a broker beside it on this host is not taken for its own.
		if m := probeManagement(node.URL); m != "" {
			t.Fatalf("the private node's management API is said to be %s", m)
		}
		e := newEnv(t, node.URL, "", openJournal(filepath.Join(root, brokerKey(node.URL)), os.Getpid()))
		ch := e.Channel("raw")
		if err := ch.ExchangeDeclare(e.Name("raw.ex"), "topic", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"raw.quorum", "raw.deleted"} {
			if _, err := ch.QueueDeclare(e.Name(q), true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := ch.QueueDelete(e.Name("raw.deleted"), false, false, false); err != nil {
			t.Fatal(err)
		}
		applyTopology(t, e)
		seen = listOnNode(t, node)
		if added := difference(seen, before); len(added) < 9 {
			t.Fatalf("only %v appeared on the node: the test declares too little to prove anything", added)
		}
	})
	if after := listOnNode(t, node); !slices.Equal(after, before) {
		t.Fatalf("left on the node after cleanup: %v", difference(after, before))
	}

	t.Run("sweep after a crash", func(t *testing.T) {
		root := t.TempDir()
		dir := filepath.Join(root, brokerKey(node.URL))
		dead := exitedPid(t)
		crashed := openJournal(dir, dead)
		ch, err := dialAndChannel(node.URL)
		if err != nil {
			t.Fatal(err)
		}
		prefix := prefixFor(t.Name())
		left := []object{{queue, prefix + ".work"}, {queue, prefix + ".lane"}, {exchange, prefix + ".ex"}}
		for _, o := range left {
			declareObject(t, ch, o)
			crashed.add(o)
		}
		// A name the dead run had deleted itself is not touched again.
		crashed.done(left[1:2])
		// A journal of a live process is left alone.
		living := openJournal(dir, livePid(t))
		alive := object{queue, prefix + ".alive"}
		declareObject(t, ch, alive)
		living.add(alive)

		note := sweepEarlierRuns(root, node.URL, "")
		if !strings.Contains(note, "swept 2 objects") {
			t.Errorf("sweep said %q, want it to name the 2 objects left", note)
		}
		remaining := difference(listOnNode(t, node), before)
		if want := []string{"queue " + prefix + ".alive", "queue " + prefix + ".lane"}; !slices.Equal(remaining, want) {
			t.Errorf("after the sweep the node has %v beyond its start, want %v", remaining, want)
		}
		if _, err := os.Stat(crashed.path); !os.IsNotExist(err) {
			t.Errorf("the dead run's journal is still there: %v", err)
		}
		if _, err := os.Stat(living.path); err != nil {
			t.Errorf("the live run's journal is gone: %v", err)
		}
	})
}

// applyTopology applies a topology against e.URL: code that dials
// the broker itself, as a consumer or the CLI does in tests.
func applyTopology(t *testing.T, e *Env) {
	t.Helper()
	doc := fmt.Sprintf(`queues:
  - name: %s
    exchange:
      name: %s
      type: direct
    bindings: [k]
    delivery_limit: 3
    retry:
      tiers: [200ms, 400ms]
      jitter: 0
    accepts:
      - type: test.event
        versions: ["1"]
`, e.Name("work"), e.Name("ex"))
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := publisher.Dial(e.URL, "dlxbridge-test/apply")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	topo, err := topology.BuildFor(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&topology.Broker{Conn: conn}).Apply(context.Background(), topo); err != nil {
		t.Fatalf("topology apply: %v", err)
	}
}

// listOnNode lists the node's queues and exchanges as "queue <name>" and
// "exchange <name>", sorted, over rabbitmqctl (the node has no management
// API).
func listOnNode(t *testing.T, n *Node) []string {
	t.Helper()
	var all []string
	for _, k := range []kind{queue, exchange} {
		out, err := n.ctl(60*time.Second, "list_"+k.String()+"s", "name", "--no-table-headers")
		if err != nil {
			t.Fatalf("rabbitmqctl list_%ss: %v\n%s", k, err, out)
		}
		for _, name := range strings.Split(string(out), "\n") {
			if name = strings.TrimSpace(name); name != "" { // the default exchange has no name
				all = append(all, k.String()+" "+name)
			}
		}
	}
	slices.Sort(all)
	return all
}

func difference(a, b []string) []string {
	return slices.DeleteFunc(slices.Clone(a), func(s string) bool { return slices.Contains(b, s) })
}

func dialAndChannel(u string) (*amqp.Channel, error) {
	conn, err := dialWithin(u, "dlxbridge-test/crashed-run", dialTimeout)
	if err != nil {
		return nil, err
	}
	return conn.Channel() // the connection goes with the private node
}

func declareObject(t *testing.T, ch *amqp.Channel, o object) {
	t.Helper()
	var err error
	if o.kind == queue {
		_, err = ch.QueueDeclare(o.name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	} else {
		err = ch.ExchangeDeclare(o.name, "topic", true, false, false, false, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// exitedPid returns the pid of a process that has exited.
func exitedPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// livePid starts a process that lives until the test ends.
func livePid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

func TestPrefixTimeReadsWhatPrefixForWrote(t *testing.T) {
	t.Setenv("DLXBRIDGE_TEST_RUN", "ci42")
	p := prefixFor("TestSomething/sub case")
	if !strings.HasPrefix(p, "t-ci42-testsomething-sub-case-") {
		t.Fatalf("prefix %q", p)
	}
	prefix, made, ok := prefixTime(p + ".work.retry.1s.l0")
	if !ok || prefix != p || time.Since(made) > time.Minute || time.Until(made) > time.Second {
		t.Fatalf("prefixTime(%q) = %q, %v, %v", p, prefix, made, ok)
	}
	for _, name := range []string{"t-old-format-a1b2c3.work", "orders.work", "t-x-z_a1b2c3", "t-x-abcdefzzzzzz"} {
		if _, _, ok := prefixTime(name); ok {
			t.Errorf("prefixTime(%q) parsed a time", name)
		}
	}
}

// On a broker with the management API, the sweep deletes old harness
// objects whose test is gone, and leaves those whose test still holds a
// connection. The objects are new (so that no other test binary's sweep
// takes them); the sweep is asked to look from ten minutes on.
func TestManagementSweepSparesLiveTests(t *testing.T) {
	t.Parallel()
	e := Require(t)
	e.RequireManagement()
	gone, live := prefixFor("sweep-gone"), prefixFor("sweep-live")
	ch := e.Channel("setup")
	for _, name := range []string{gone + ".q", live + ".q"} {
		e.TrackQueue(name)
		declareObject(t, ch, object{queue, name})
	}
	held, err := dialWithin(e.URL, live+"/probe", dialTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	later := time.Now().Add(10 * time.Minute)
	if stale, err := staleByManagement(e.ManagementURL, e.brokerURL, time.Now()); err != nil {
		t.Fatal(err)
	} else if slices.Contains(stale, object{queue, gone + ".q"}) {
		t.Fatalf("a queue made just now is called stale")
	}
	// The management API lists a connection after its first stats emission.
	deadline := time.Now().Add(20 * time.Second)
	for {
		stale, err := staleByManagement(e.ManagementURL, e.brokerURL, later)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(stale, object{queue, gone + ".q"}) {
			t.Fatalf("the old queue of a test without connections is not stale: %v", stale)
		}
		if !slices.Contains(stale, object{queue, live + ".q"}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue of a test holding a connection is called stale")
		}
		time.Sleep(250 * time.Millisecond) // the management API has no events
	}
}

// A management URL written with credentials loses them (and a trailing
// slash), per node of a list, so the AMQP URL's (or a test user's) are the
// ones the API sees.
func TestManagementURLDropsUserinfo(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                                    "",
		"http://127.0.0.1:15672":              "http://127.0.0.1:15672",
		"http://guest:guest@127.0.0.1:15672/": "http://127.0.0.1:15672",
		"http://a:b@n1:15672,http://n2:15672,https://c:d@n3:15671": "http://n1:15672,http://n2:15672,https://n3:15671",
	} {
		if got := bareManagementURLs(in); got != want {
			t.Errorf("bareManagementURLs(%q) = %q, want %q", in, got, want)
		}
	}
}
