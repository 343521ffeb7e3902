package consumer

// Ready reports whether Run is consuming: connected, with a consumer on
// every queue that has a handler. It turns false as soon as the connection,
// the publishing connection or a queue's channel is lost, or a stop begins,
// and true again once a reconnect is consuming. A health endpoint
// (`dlxbridge run`'s /readyz) reads it; it is safe to call concurrently.
func (c *Consumer) Ready() bool { return c.ready.Load() }

// Node names the node Run is connected to: its host:port, then the
// broker's cluster name and version when it gave them, e.g.
// "10.0.0.2:5672 (cluster rabbit@n1, RabbitMQ 4.3.6)"; "" between
// connections. With several nodes in Config.URL it says which one took
// over after a failover. Safe to call concurrently.
func (c *Consumer) Node() string {
	if n := c.node.Load(); n != nil {
		return n.String()
	}
	return ""
}
