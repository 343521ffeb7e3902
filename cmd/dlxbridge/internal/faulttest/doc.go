// Package faulttest holds the fault suite: the dlxbridge runtime, used only
// through its public API, on a private RabbitMQ node while faults are
// injected (the consumer SIGKILLed and restarted, the node's application
// stopped and started, every connection force-closed again and again, the
// quarantine deleted mid-stream, a memory alarm while retries are
// published). Each test publishes a known set of ids and proves at the end
// that every id was handled or quarantined: none lost, duplicates counted
// apart.
//
// The slowest run longer with DLXBRIDGE_FAULTS=full (set by .ci/run on one
// broker pass), which also runs the cluster tests, on the three-node
// cluster of scripts/rabbitmq-cluster (docs/cluster.md); the package has no
// code besides its tests. The tests do not
// run in parallel: each boots a private Erlang node, and several at once on
// a small machine starve each other (and the shared brokers).
package faulttest
