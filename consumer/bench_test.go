package consumer

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlxbridge/dlxbridge/config"
)

// BenchmarkThroughput compares a no-op handler through the full runtime
// (crash-loop guard, attempt counting, schema gate, handler, ack, metrics,
// spans with the global no-op tracer) with plain amqp091-go consume+ack on the
// same kind of quorum queue, with the same prefetch and one worker each. Run
// both in one invocation and compare ns/op:
//
//	go test -run '^$' -bench Throughput -benchtime 5000x ./consumer/
func BenchmarkThroughput(b *testing.B) {
	b.Run("plain-amqp091", benchPlain)
	b.Run("dlxbridge-runtime", benchRuntime)
}

const benchPrefetch = 50

func benchPlain(b *testing.B) {
	tb := setup(b, nil)
	tb.publishBatch(b.N, "", tb.queue.Name)
	ch := tb.env.Channel("plain-consumer")
	if err := ch.Qos(benchPrefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu := startCPU()
	deliveries, err := ch.Consume(tb.queue.Name, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		d := <-deliveries
		if err := d.Ack(false); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu.report(b)
}

func benchRuntime(b *testing.B) {
	tb := setup(b, func(q *config.Queue) {
		q.Consumer.Prefetch = benchPrefetch
		q.Consumer.Concurrency = 1
	})
	tb.publishBatch(b.N, "", tb.queue.Name)
	var acked atomic.Int64
	all := make(chan struct{})
	tb.cfg.OnSettled = func(s Settled) {
		if s.Outcome == OutcomeAcked && acked.Add(1) == int64(b.N) {
			close(all)
		}
	}
	b.ResetTimer()
	cpu := startCPU()
	tb.start(func(c *Consumer) {
		must(b, c.Handle(tb.queue.Name, testType, HandlerFunc(func(ctx context.Context, m *Message) error { return nil })))
	})
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d acked", acked.Load(), b.N)
	}
	b.StopTimer()
	cpu.report(b)
}

// cpuMeter measures this process's CPU time (user+sys): wall time per
// message is dominated by the broker on a 2-core machine, CPU time shows
// what the client side costs.
type cpuMeter struct{ start time.Duration }

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU() cpuMeter { return cpuMeter{processCPU()} }

func (m cpuMeter) report(b *testing.B) {
	b.ReportMetric(float64(processCPU()-m.start)/float64(b.N), "client-cpu-ns/op")
}
