package publisher_test

import (
	"testing"

	"github.com/dlxbridge/dlxbridge/internal/brokertest"
	"github.com/dlxbridge/dlxbridge/publisher"
)

// Dial's errors never quote the password, even for a URL that does not
// parse, where amqp091-go's own Dial quotes it.
func TestDialNeverShowsThePassword(t *testing.T) {
	t.Parallel()
	for _, s := range brokertest.HostileSecrets() {
		// Port 1: nothing listens there, so a URL that parses fails to connect.
		_, err := publisher.Dial(brokertest.WithPassword("amqp", "guest", s.Password, "127.0.0.1:1/"), "dial-test")
		if err == nil {
			t.Fatalf("%q: Dial succeeded", s.Password)
		}
		s.Check(t, "Dial error", err.Error())
	}
}
