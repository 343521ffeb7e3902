package sidecar

import (
	"errors"
	"log/slog"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dlxbridge/dlxbridge/config"
	"github.com/dlxbridge/dlxbridge/internal/amqpx"
)

// The quarantine's streams can be written three ways: through the default
// exchange (write on amq.default, which reaches every queue by name: the
// runtime needs it, and the signatures tell its writes from anyone
// else's), and, with write on a stream's own name, by binding the stream
// to an exchange the user may read or by publishing to it over the stream
// protocol. The runtime needs no write on its streams (it declares them
// with configure and writes them through amq.default), so a user that has
// it has more than it needs: most often a user shared with producers, such
// as guest.

// probeKey is the binding key of the probe: a binding that nobody makes.
const probeKey = "dlxbridge.permission-probe"

// streamWritable reports whether the user of conn may write queue by name.
// It asks the broker, which evaluates the user's own permission regex
// (Erlang's, lookaheads included), with a queue.unbind from amq.direct of a
// binding that does not exist: the broker checks write on the queue before
// anything else (read on the exchange, the binding), so only a refusal
// naming the queue says no, and when the write is allowed nothing exists
// to remove (seen on 3.10.8 and 4.3.6). Reading the user's permissions
// from the management API instead needs an administrator, and Go's regexp
// cannot run the lookaheads the documented regex uses.
func streamWritable(conn *amqp.Connection, queue string) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	err = ch.QueueUnbind(queue, probeKey, "amq.direct", nil)
	if err == nil {
		_ = ch.Close()
		return true, nil
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false, err
	}
	switch {
	case ae.Code == amqp.NotFound: // a missing queue, found after the check
		return true, nil
	case ae.Code == amqp.AccessRefused && strings.Contains(ae.Reason, "queue '"+queue+"'"):
		return false, nil
	case ae.Code == amqp.AccessRefused && strings.Contains(ae.Reason, "exchange 'amq.direct'"):
		return true, nil // the write on the queue was allowed; read on amq.direct is not
	}
	return false, err
}

// quarantineStreams are the records and events streams of cfg's
// quarantines, each once, in config order.
func quarantineStreams(cfg *config.Config) []string {
	var out []string
	seen := map[string]bool{}
	for _, q := range cfg.Queues {
		for _, s := range []string{q.Quarantine.RecordsStream(), q.Quarantine.EventsStream()} {
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	return out
}

// warnStreamWriters logs one WARN line when the runtime's own broker user
// (url's) may write any of the quarantine's streams by name, naming the
// user, the vhost and the streams; one INFO line when it cannot tell.
func warnStreamWriters(conn *amqp.Connection, url string, cfg *config.Config, log *slog.Logger) {
	// url may list several nodes: read the user and vhost through the
	// dialer's own parser (every entry names the same ones), never by
	// parsing the whole list as one URL, which would put the other
	// entries, passwords and all, into the vhost.
	user, vhost := "", "/"
	if eps, err := amqpx.ParseURLList(url); err == nil && len(eps) > 0 {
		user, vhost = eps[0].User, eps[0].Vhost
	}
	var writable []string
	for _, s := range quarantineStreams(cfg) {
		ok, err := streamWritable(conn, s)
		if err != nil {
			log.Info("could not check whether this broker user may write the quarantine's streams", "user", user, "vhost", vhost, "stream", s, "error", err)
			return
		}
		if ok {
			writable = append(writable, s)
		}
	}
	if len(writable) == 0 {
		return
	}
	log.Warn("this broker user may write the quarantine's streams by name: with its credentials anyone can bind them to an exchange it reads "+
		"or publish into them over the stream protocol, and forge records and events there. The runtime needs no write on them; "+
		"give it a write permission that leaves them out (docs/quarantine.md, \"Who may write the streams\")",
		"user", user, "vhost", vhost, "streams", strings.Join(writable, " "))
}
