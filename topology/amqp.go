package topology

import (
	"errors"
	"fmt"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"
)

// probe is what one AMQP check found.
type probe int

const (
	probeOK       probe = iota // exists (and, for a redeclare, is equivalent)
	probeMissing               // 404 NOT_FOUND
	probeConflict              // 406 PRECONDITION_FAILED; see the diff
	probeKeep                  // equivalent but for a declare-time argument; see the diff
)

// declareMode says whether a declare only checks (passive) or declares.
type declareMode int

const (
	passive declareMode = iota
	active
)

// The one wrapper around amqp091-go's positional booleans. Every exchange
// and queue dlxbridge declares is durable, not auto-deleted, not exclusive,
// and waits for the broker's answer; only the shared tiers' return and
// unrouted exchanges are internal.
func declareExchange(ch *amqp.Channel, x ExchangeSpec, mode declareMode) error {
	const durable, autoDelete, noWait = true, false, false
	if mode == passive {
		return ch.ExchangeDeclarePassive(x.Name, x.Kind, durable, autoDelete, x.Internal, noWait, nil)
	}
	return ch.ExchangeDeclare(x.Name, x.Kind, durable, autoDelete, x.Internal, noWait, amqp.Table(x.Args))
}

func declareQueue(ch *amqp.Channel, q QueueSpec, mode declareMode) error {
	const durable, autoDelete, exclusive, noWait = true, false, false, false
	args := amqp.Table(q.Args)
	if mode == passive {
		_, err := ch.QueueDeclarePassive(q.Name, durable, autoDelete, exclusive, noWait, args)
		return err
	}
	_, err := ch.QueueDeclare(q.Name, durable, autoDelete, exclusive, noWait, args)
	return err
}

func bindQueue(ch *amqp.Channel, b BindingSpec) error {
	const noWait = false
	return ch.QueueBind(b.Queue, b.Key, b.Exchange, noWait, nil)
}

// withChannel runs op on a fresh channel and closes it. A 404 or 406 closes
// the channel on the broker side, so no channel is ever reused after a probe.
func withChannel(conn *amqp.Connection, op func(*amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	err = op(ch)
	_ = ch.Close()
	return err
}

// classify maps a probe's error to its outcome. A 406 comes with the parsed
// difference (or the raw text as Have when the broker's wording is
// unknown); any other error is returned as is.
func classify(object string, err error) (probe, *ArgDiff, error) {
	if err == nil {
		return probeOK, nil, nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.NotFound:
			return probeMissing, nil, nil
		case amqp.PreconditionFailed:
			if d, ok := ParseInequivalent(ae.Reason); ok {
				return probeConflict, &d, nil
			}
			return probeConflict, &ArgDiff{Object: object, Arg: "?", Want: "(as configured)", Have: ae.Reason}, nil
		}
	}
	return 0, nil, fmt.Errorf("%s: %w", object, err)
}

// probeExchange checks an exchange: passive for existence, then an
// equivalent redeclare (a no-op when it matches) for its type.
func probeExchange(conn *amqp.Connection, x ExchangeSpec) (probe, *ArgDiff, error) {
	obj := exchangeObject(x.Name)
	err := withChannel(conn, func(ch *amqp.Channel) error { return declareExchange(ch, x, passive) })
	if p, d, err := classify(obj, err); err != nil || p != probeOK {
		return p, d, err
	}
	err = withChannel(conn, func(ch *amqp.Channel) error { return declareExchange(ch, x, active) })
	return classify(obj, err)
}

// probeQueue checks a queue: passive first (an active declare would create a
// missing queue), then an active redeclare with the exact arguments, which
// is a no-op on an equivalent queue and a 406 naming the first differing
// argument otherwise.
func probeQueue(conn *amqp.Connection, q QueueSpec) (probe, *ArgDiff, error) {
	obj := queueObject(q.Name)
	err := withChannel(conn, func(ch *amqp.Channel) error { return declareQueue(ch, q, passive) })
	if p, d, err := classify(obj, err); err != nil || p != probeOK {
		return p, d, err
	}
	err = withChannel(conn, func(ch *amqp.Channel) error { return declareQueue(ch, q, active) })
	p, d, err := classify(obj, err)
	if err != nil || p != probeConflict || !declareTimeArg(d.Arg) {
		return p, d, err
	}
	// The broker compares a replica count on redeclare although it reads
	// it only at creation, and names one differing argument per refusal:
	// declare again with the broker's own value, to check the others.
	kept := *d
	args := make(map[string]any, len(q.Args))
	for k, v := range q.Args {
		args[k] = v
	}
	if n, perr := strconv.ParseInt(d.Have, 10, 64); perr == nil {
		args[d.Arg] = n
	} else {
		delete(args, d.Arg)
	}
	q.Args = args
	err = withChannel(conn, func(ch *amqp.Channel) error { return declareQueue(ch, q, active) })
	if p, d, err = classify(obj, err); err != nil || p != probeOK {
		return p, d, err
	}
	return probeKeep, &kept, nil
}

func queueObject(name string) string    { return "queue '" + name + "'" }
func exchangeObject(name string) string { return "exchange '" + name + "'" }
func bindingObject(b BindingSpec) string {
	return fmt.Sprintf("binding '%s' -> '%s' key '%s'", b.Exchange, b.Queue, b.Key)
}
