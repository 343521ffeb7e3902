package consumer

// Ready reports whether Run is consuming: connected, with a consumer on
// every queue that has a handler. It turns false as soon as the connection,
// the publishing connection or a queue's channel is lost, or a stop begins,
// and true again once a reconnect is consuming. A health endpoint
// (`dlxbridge run`'s /readyz) reads it; it is safe to call concurrently.
func (c *Consumer) Ready() bool { return c.ready.Load() }
