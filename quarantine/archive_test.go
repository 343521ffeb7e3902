package quarantine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/topology"
	"github.com/dlxbridge/dlxbridge/wire"
)

// archiveJobs puts n test.job messages into the intake, each with headers
// of every AMQP type and every property set, and returns their bodies by
// message id.
func (b *storeBundle) archiveJobs(n int) map[string][]byte {
	b.t.Helper()
	now := time.Now().UTC().Truncate(time.Second)
	bodies := map[string][]byte{}
	for i := 0; i < n; i++ {
		h := everyType()
		delete(h, "nan") // a quorum queue refuses NaN and infinite floats
		delete(h, "inf")
		delete(h, "f32nan")
		for k, v := range envelopeHeaders(b.q.Name, "fp-arch", "boom", now) {
			h[k] = v
		}
		id := fmt.Sprintf("arch-%d", i)
		body := []byte(fmt.Sprintf(`{"id":"j-%d – ünïcode ✓","n":%d}`, i, i))
		bodies[id] = body
		b.publish(b.q.Quarantine.Queue, amqp.Publishing{
			Headers: h, ContentType: "application/json", ContentEncoding: "identity", DeliveryMode: amqp.Persistent,
			Priority: 2, CorrelationId: "corr-" + id, ReplyTo: "reply", MessageId: id, Timestamp: now, Type: "test.job",
			UserId: "guest", AppId: "app", Body: body,
		})
	}
	return bodies
}

// drain takes n messages off queue, by message id.
func (b *storeBundle) drain(queue string, n int) map[string]amqp.Delivery {
	b.t.Helper()
	ch := b.env.Channel("drain")
	out := map[string]amqp.Delivery{}
	deadline := time.Now().Add(20 * time.Second)
	for len(out) < n {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			b.t.Fatal(err)
		}
		if !ok {
			if time.Now().After(deadline) {
				b.t.Fatalf("%s: got %d of %d", queue, len(out), n)
			}
			time.Sleep(20 * time.Millisecond) // basic.get has no wait
			continue
		}
		out[d.MessageId] = d
	}
	return out
}

// lose deletes the quarantine's records and events streams and declares
// them anew: the quarantine as a disaster (or retention) leaves it.
func (b *storeBundle) lose() {
	b.t.Helper()
	ch := b.env.Channel("lose")
	for _, s := range []string{b.q.Quarantine.RecordsStream(), b.q.Quarantine.EventsStream()} {
		if _, err := ch.QueueDelete(s, false, false, false); err != nil {
			b.t.Fatal(err)
		}
	}
	topo, err := topology.BuildFor(b.cfg, b.conn)
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := (&topology.Broker{Conn: b.conn}).Apply(context.Background(), topo); err != nil {
		b.t.Fatal(err)
	}
}

// An export, then a replay from it after the quarantine's streams are
// gone, gives the work queue exactly what a normal replay gave it: every
// body byte, header (of every AMQP type) and property. A record the
// archive replay sent is not sent again by a second one.
func TestExportReplayFromArchiveIsByteExact(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	const n = 5
	bodies := b.archiveJobs(n)
	b.keep(n)
	dir := filepath.Join(t.TempDir(), "archive")
	in := b.inspector()
	m, err := in.Export(context.Background(), ExportOptions{Dir: dir, Filter: Filter{Queue: b.q.Name}, Vhost: "/"})
	if err != nil {
		t.Fatal(err)
	}
	if m.Count != n || len(m.Records) != n {
		t.Fatalf("manifest counts %d, %d records; want %d", m.Count, len(m.Records), n)
	}
	if _, err := in.Export(context.Background(), ExportOptions{Dir: dir, Filter: Filter{Queue: b.q.Name}}); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("export into a non-empty directory: %v", err)
	}

	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rp := b.replayer()
	rp.Now = func() time.Time { return clock }
	normal, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Queue: b.q.Name}, Reason: "r"})
	if err != nil || len(normal.Sent) != n {
		t.Fatalf("normal replay: %v %+v", err, normal)
	}
	want := b.drain(b.q.Name, n)

	b.lose()
	a, err := b.inspector().ReadArchive(dir)
	if err != nil {
		t.Fatal(err)
	}
	dry, err := rp.Replay(context.Background(), ReplayOptions{Archive: a, Filter: Filter{Queue: b.q.Name}, Reason: "r", DryRun: true})
	if err != nil || dry.Selected != n || len(dry.Sent) != 0 {
		t.Fatalf("dry run from the archive: %v %+v", err, dry)
	}
	res, err := rp.Replay(context.Background(), ReplayOptions{Archive: a, Filter: Filter{Queue: b.q.Name}, Reason: "r"})
	if err != nil || len(res.Sent) != n {
		t.Fatalf("replay from the archive: %v %+v", err, res)
	}
	got := b.drain(b.q.Name, n)
	for id, w := range want {
		g, ok := got[id]
		if !ok {
			t.Fatalf("%s not replayed from the archive", id)
		}
		if !bytes.Equal(g.Body, w.Body) || !bytes.Equal(g.Body, bodies[id]) {
			t.Errorf("%s: body %q, normal replay %q", id, g.Body, w.Body)
		}
		// Each replay is a job of its own: only its id differs.
		if g.Headers[wire.HeaderReplayJob] != res.Run || w.Headers[wire.HeaderReplayJob] == res.Run {
			t.Errorf("%s: replay job %v, normal replay's %v; want %s and another", id, g.Headers[wire.HeaderReplayJob], w.Headers[wire.HeaderReplayJob], res.Run)
		}
		delete(g.Headers, wire.HeaderReplayJob)
		delete(w.Headers, wire.HeaderReplayJob)
		if !sameValue(g.Headers, w.Headers) {
			t.Errorf("%s: headers differ:\narchive %#v\n normal %#v", id, g.Headers, w.Headers)
		}
		if g.ContentType != w.ContentType || g.ContentEncoding != w.ContentEncoding || g.DeliveryMode != w.DeliveryMode ||
			g.Priority != w.Priority || g.CorrelationId != w.CorrelationId || g.ReplyTo != w.ReplyTo || g.Expiration != w.Expiration ||
			!g.Timestamp.Equal(w.Timestamp) || g.Type != w.Type || g.UserId != w.UserId || g.AppId != w.AppId {
			t.Errorf("%s: properties differ:\narchive %+v\n normal %+v", id, g, w)
		}
		if g.Headers["nested"] == nil || g.Headers["bytes"] == nil {
			t.Errorf("%s: the typed headers did not survive: %v", id, g.Headers)
		}
	}
	// Its replayed events are in the (new) events stream: a second replay
	// of the same archive selects nothing.
	again, err := rp.Replay(context.Background(), ReplayOptions{Archive: a, Filter: Filter{Queue: b.q.Name}, Reason: "r"})
	if err != nil || again.Selected != 0 || len(again.Sent) != 0 {
		t.Fatalf("second replay of the archive: %v %+v", err, again)
	}
	if d := b.depth(b.q.Name); d != 0 {
		t.Fatalf("work queue holds %d after the second replay", d)
	}
}

// rewriteLine changes line i of the archive in dir with edit, and, when
// fixManifest, writes the manifest's digests to match (a forger who
// rewrites both).
func rewriteLine(t *testing.T, dir string, i int, edit func(line []byte) []byte, fixManifest bool) {
	t.Helper()
	path := filepath.Join(dir, archiveRecordsFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(data, []byte{'\n'}), []byte{'\n'})
	lines[i] = edit(lines[i])
	data = append(bytes.Join(lines, []byte{'\n'}), '\n')
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if !fixManifest {
		return
	}
	var m Manifest
	mb, _ := os.ReadFile(filepath.Join(dir, archiveManifestFile))
	if err := json.Unmarshal(mb, &m); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lines[i])
	m.Records[i].SHA256 = hex.EncodeToString(sum[:])
	whole := sha256.Sum256(data)
	m.SHA256 = hex.EncodeToString(whole[:])
	mb, _ = json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, archiveManifestFile), mb, 0o600); err != nil {
		t.Fatal(err)
	}
}

// One changed byte in one line refuses the whole archive, naming the
// record; so does a line dropped or a manifest that lists another id.
// An archive whose digests were rewritten to match passes the digests,
// but its envelope's "verified" stays a claim: a replay with the key signs
// no origin for it.
func TestReplayFromATamperedArchiveIsRefused(t *testing.T) {
	t.Parallel()
	b := setupStore(t, nil)
	b.archiveJobs(3)
	b.keep(3)
	in := b.inspector()
	export := func() (string, *Manifest) {
		dir := filepath.Join(t.TempDir(), "a")
		m, err := in.Export(context.Background(), ExportOptions{Dir: dir, Filter: Filter{Queue: b.q.Name}})
		if err != nil {
			t.Fatal(err)
		}
		return dir, m
	}

	dir, m := export()
	rewriteLine(t, dir, 1, func(l []byte) []byte { return bytes.Replace(l, []byte(`"priority":2`), []byte(`"priority":9`), 1) }, false)
	_, err := in.ReadArchive(dir)
	if !errors.Is(err, ErrArchive) || !strings.Contains(err.Error(), m.Records[1].ID) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("a changed line: %v, want a refusal naming line 2 (record %s)", err, m.Records[1].ID)
	}
	rp := b.replayer()
	if _, err := rp.Replay(context.Background(), ReplayOptions{Filter: Filter{Queue: b.q.Name}, DryRun: true}); err != nil {
		t.Fatal(err)
	}

	dir, _ = export()
	data, _ := os.ReadFile(filepath.Join(dir, archiveRecordsFile))
	first, _, _ := bytes.Cut(data, []byte{'\n'})
	if err := os.WriteFile(filepath.Join(dir, archiveRecordsFile), append(first, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := in.ReadArchive(dir); !errors.Is(err, ErrArchive) {
		t.Fatalf("lines dropped: %v", err)
	}

	dir, _ = export()
	key := envSigner(t, "the consumers' key, 32 bytes....")
	rewriteLine(t, dir, 0, func(l []byte) []byte {
		return bytes.Replace(l, []byte(`"verified":false`), []byte(`"verified":true`), 1)
	}, true)
	a, err := in.ReadArchive(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.Records[0].Envelope.Verified {
		t.Fatal("an archive's verified flag was taken as read")
	}
	rp.Signer = key
	res, err := rp.Replay(context.Background(), ReplayOptions{Archive: a, Filter: Filter{IDs: []string{a.Records[0].ID}}, Reason: "r"})
	if err != nil || len(res.Sent) != 1 {
		t.Fatalf("replay: %v %+v", err, res)
	}
	d := b.drain(b.q.Name, 1)[a.Records[0].Properties.MessageID]
	if _, signed := d.Headers[wire.HeaderSignature]; signed {
		t.Fatalf("an envelope no key verifies got its origin signed: %v", d.Headers)
	}
}

// TestMeasureArchive exports DLXBRIDGE_MEASURE_ARCHIVE records and replays
// them from the archive (after the streams are gone), and logs the times;
// it runs only when asked:
//
//	DLXBRIDGE_MEASURE_ARCHIVE=1000 RABBITMQ_URL=... go test -run TestMeasureArchive -v ./quarantine/
func TestMeasureArchive(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DLXBRIDGE_MEASURE_ARCHIVE"))
	if n <= 0 {
		t.Skip("set DLXBRIDGE_MEASURE_ARCHIVE to measure")
	}
	b := setupStore(t, nil)
	b.quarantineJobs(n, "fp-m", validJob)
	b.keep(n)
	dir := filepath.Join(t.TempDir(), "a")
	start := time.Now()
	m, err := b.inspector().Export(context.Background(), ExportOptions{Dir: dir, Filter: Filter{Queue: b.q.Name}})
	if err != nil || m.Count != n {
		t.Fatalf("export: %v", err)
	}
	exported := time.Since(start)
	st, _ := os.Stat(filepath.Join(dir, archiveRecordsFile))
	b.lose()
	start = time.Now()
	a, err := b.inspector().ReadArchive(dir)
	if err != nil {
		t.Fatal(err)
	}
	read := time.Since(start)
	res, err := b.replayer().Replay(context.Background(), ReplayOptions{Archive: a, Filter: Filter{Queue: b.q.Name}, Reason: "m"})
	if err != nil || len(res.Sent) != n {
		t.Fatalf("replay: %v", err)
	}
	t.Logf("%d records: export %s (%.0f/s, %d bytes), read+verify %s, replay from the archive %s sending (%.0f/s)",
		n, exported.Round(time.Millisecond), float64(n)/exported.Seconds(), st.Size(), read.Round(time.Millisecond),
		time.Duration(res.Duration).Round(time.Millisecond), float64(n)/time.Duration(res.Duration).Seconds())
}
