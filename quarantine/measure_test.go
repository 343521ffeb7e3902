package quarantine

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// TestMeasureListing writes DLXBRIDGE_MEASURE_RECORDS records (e.g. 100000)
// straight into a records stream and logs how long a snapshot, list and
// stats take. A measurement, not a timed test: it asserts only the count,
// and runs only when asked. DLXBRIDGE_MEASURE_CPUPROFILE=FILE profiles
// the snapshots (not the writing).
//
//	DLXBRIDGE_MEASURE_RECORDS=100000 RABBITMQ_URL=... go test -run TestMeasureListing -v ./quarantine/
func TestMeasureListing(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DLXBRIDGE_MEASURE_RECORDS"))
	if n <= 0 {
		t.Skip("set DLXBRIDGE_MEASURE_RECORDS to measure")
	}
	b := setupStore(t, nil)
	stream := b.q.Quarantine.RecordsStream()
	now := time.Now().UTC()
	start := time.Now()
	const batch = 500
	for from := 0; from < n; from += batch {
		for i := from; i < min(from+batch, n); i++ {
			fp := fmt.Sprintf("fp-%d", i%3)
			d := &amqp.Delivery{MessageId: fmt.Sprintf("m-%d", i), Type: "test.job", ContentType: "application/json",
				Headers: envelopeHeaders(b.q.Name, fp, "failed "+fp, now), Body: []byte(validJob(i))}
			msg, _, err := encodeRecord(d, b.q.Quarantine.Queue, now, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.pub.PublishWithContext(context.Background(), "", stream, false, false, msg); err != nil {
				t.Fatal(err)
			}
		}
		for i := from; i < min(from+batch, n); i++ {
			if c := <-b.conf; !c.Ack {
				t.Fatal("nacked")
			}
		}
	}
	t.Logf("wrote %d records in %s", n, time.Since(start).Round(time.Millisecond))
	// The reads go straight to the broker, as the CLI's do, not through
	// the test harness's recording relay (they declare nothing).
	direct := func(purpose string) *amqp.Connection {
		u := os.Getenv("RABBITMQ_URL")
		if u == "" {
			u = amqpx.DefaultURL
		}
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName(b.env.Prefix + "/" + purpose)
		conn, err := amqp.DialConfig(u, amqp.Config{Properties: props})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	start = time.Now()
	raw := 0
	if err := readStream(context.Background(), direct("raw"), stream, streamWaits{}, func(int64, *amqp.Delivery) error { raw++; return nil }); err != nil {
		t.Fatal(err)
	}
	t.Logf("raw read of %d stream messages, nothing decoded: %s", raw, time.Since(start).Round(time.Millisecond))
	in := &Inspector{Conn: direct("inspector"), Config: b.cfg}
	if path := os.Getenv("DLXBRIDGE_MEASURE_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	for round := 1; round <= 3; round++ {
		start = time.Now()
		snap := b.snapshot(in)
		read := time.Since(start)
		start = time.Now()
		list := snap.List(Filter{})
		stats := snap.Stats(Filter{})
		load, _ := os.ReadFile("/proc/loadavg")
		t.Logf("round %d: snapshot of %d records in %s; list (%d) and stats (%d groups) in %s; load average %.14s", round, len(snap.Records), read.Round(time.Millisecond),
			len(list), len(stats), time.Since(start).Round(time.Millisecond), load)
		if len(snap.Records) != n {
			t.Fatalf("read %d of %d", len(snap.Records), n)
		}
	}
}
