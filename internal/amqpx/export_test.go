package amqpx

// Test hooks: pipeline state a test waits on, which has no event of its own.

// BufferedConfirms is how many confirms the client has handed over that the
// pipeline has not read yet.
func (p *Pipeline) BufferedConfirms() int { return len(p.confirms) }

// CloseSeen reports whether the client has handed over its channel's close,
// and the pipeline has not read it yet.
func (p *Pipeline) CloseSeen() bool { return len(p.closed) > 0 }
