package topology

import "github.com/dlxbridge/dlxbridge/config"

// Stream arguments.
const (
	ArgMaxAge            = "x-max-age"
	QueueTypeStream      = "stream"
	RoleRecords     Role = "quarantine-records"
	RoleEvents      Role = "quarantine-events"
)

// quarantineStreams are the two streams beside a quarantine queue Q (the
// intake, which stays a quorum queue so the broker's own dead letters and
// the runtime's quarantine publishes keep their confirm-before-ack path):
//
//	Q ──the runtime's keeper: publish, confirm, then ack──▶ Q.records (stream, x-max-age = retention)
//	quarantine replay / purge ──▶ Q.events (stream, x-max-age = 2 × retention)
//
// Reading a stream by offset consumes nothing, so listing, showing and
// counting records never change them (docs/quarantine.md). Nothing is bound
// to either stream: the bridge publishes to them by name through the default
// exchange.
func quarantineStreams(qc *config.Queue) []QueueSpec {
	return []QueueSpec{
		{Name: qc.Quarantine.RecordsStream(), Role: RoleRecords, Owner: qc.Name, Args: map[string]any{
			ArgQueueType: QueueTypeStream, ArgMaxAge: qc.Quarantine.MaxAge(),
		}},
		{Name: qc.Quarantine.EventsStream(), Role: RoleEvents, Owner: qc.Name, Args: map[string]any{
			ArgQueueType: QueueTypeStream, ArgMaxAge: qc.Quarantine.EventsMaxAge(),
		}},
	}
}

// queueType is the x-queue-type the spec declares (quorum unless it says).
func (q QueueSpec) queueType() string {
	if s, ok := q.Args[ArgQueueType].(string); ok {
		return s
	}
	return QueueTypeQuorum
}
