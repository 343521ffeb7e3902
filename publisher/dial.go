package publisher

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// Dial opens a connection to the broker at url whose client-provided name
// is name, so operators can find it in the management UI. url may list
// several nodes of one cluster, comma separated: Dial connects to the
// first that answers (Connect makes a Publisher that also connects again
// when its connection is lost). Unlike
// amqp.Dial, its errors never quote the URL's password: a URL that does not
// parse (often a password with an unencoded '#', '/', '?', '@' or '%') is
// described without quoting any of it, and a refused login says so and
// names the user.
func Dial(url, name string) (*amqp.Connection, error) {
	return amqpx.Dial(url, name)
}

// DefaultURL is the broker URL the bridge's commands use when neither --url
// nor RABBITMQ_URL is given: a local broker with the guest account.
const DefaultURL = amqpx.DefaultURL
