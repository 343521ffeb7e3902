// Package quarantine owns the quarantine: the record of a message the
// bridge gave up on, where it is kept, and the way back out.
//
// The record. A quarantined message keeps its payload as received, byte
// for byte (unless redaction rules changed it, which the record says), and
// its original AMQP properties and headers. The failure envelope (class,
// reason, error, attempts, origin, schema violations, notes) is added as
// headers named in package wire, which are part of dlxbridge's public
// contract. The runtime writes a record with Publishing, the only writer:
// it redacts, fits the record to one frame and signs the envelope, so that
// a reader with the runtime's key can tell it from one a producer wrote.
// Read and ReadVerified parse a record back, also for a message the broker
// dead-lettered on its own, which carries only x-death.
//
// The keeper. Records arrive in a quarantine's intake queue, from the
// runtime and from the broker's dead-lettering. A Keeper moves each into
// the quarantine's records stream, confirm before ack, verifying the
// envelope and redacting what the runtime did not.
//
// The inspector. An Inspector reads the records and events streams without
// changing them: a Snapshot lists records with their state (open,
// replayed, purged, expired) and groups them into stats; the events
// stream, which replays and purges write, is the audit trail.
//
// Replay. A Replayer sends selected open records back to their work queue
// (patched if asked, checked against the current schema, within the
// queue's redrive budget), each published with confirm before it is marked
// replayed; it also purges records and records the ones past retention.
//
// Metrics. Metrics exports record counts and ages from a snapshot, and
// counts what a Replayer replays, purges and sees expire.
package quarantine
