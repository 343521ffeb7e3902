package amqpx

import amqp "github.com/rabbitmq/amqp091-go"

// Test hooks: pipeline state a test waits on, which has no event of its own.

// BufferedConfirms is how many confirms the client has handed over that the
// pipeline has not read yet.
func (p *Pipeline) BufferedConfirms() int { return len(p.confirms) }

// CloseSeen reports whether the client has handed over its channel's close,
// and the pipeline has not read it yet.
func (p *Pipeline) CloseSeen() bool { return len(p.closed) > 0 }

// AfterWrite makes f run once each publish is written, before its confirm
// is awaited.
func (p *Publisher) AfterWrite(f func()) { p.afterWrite = f }

// BufferedConfirms is how many confirms the client has handed over that
// the publisher has not read yet.
func (p *Publisher) BufferedConfirms() int { return len(p.confirms) }

// CloseSeen reports whether the client has handed over its channel's close,
// and the publisher has not read it yet.
func (p *Publisher) CloseSeen() bool { return len(p.closed) > 0 }

// Channel is the publisher's channel.
func (p *Publisher) Channel() *amqp.Channel { return p.ch }
