package config_test

import (
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/config"
)

// twoQueues is a config with queues a and b; extraA and extraB are added to
// each, and set their exchange unless they name one (default: the queue's
// name).
func twoQueues(extraA, extraB string) string {
	return "queues:\n" + entry("a", extraA) + entry("b", extraB)
}

func entry(name, extra string) string {
	s := "  - name: " + name + "\n    accepts: [{type: t, versions: ['1']}]\n"
	if !strings.Contains(extra, "exchange:") {
		s += "    exchange: {name: " + name + "}\n"
	}
	return s + indent(extra, "    ")
}

// Sharing on purpose stays allowed: one quarantine for several queues, one
// exchange (same type) for several queues, and an exchange named like a
// queue (the broker keeps them apart).
func TestSharedNamesThatAreAllowed(t *testing.T) {
	t.Parallel()
	doc := twoQueues("exchange: {name: events}\nquarantine: {queue: parked}", "exchange: {name: events}\nquarantine: {queue: parked}")
	if _, err := config.Parse([]byte(doc)); err != nil {
		t.Fatalf("shared exchange and quarantine: %v", err)
	}
	if _, err := config.Parse([]byte(twoQueues("exchange: {name: b}", "exchange: {name: a}"))); err != nil {
		t.Fatalf("exchanges named like the queues: %v", err)
	}
}
