// Package amqpx is dlxbridge's AMQP plumbing: dialing named connections,
// hiding passwords, and the one confirm+mandatory publisher every component
// uses. amqp091-go's Notify* channels are created and drained only here.
package amqpx

import (
	"regexp"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultURL is the broker URL when neither --url nor RABBITMQ_URL is given.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

var passwordRE = regexp.MustCompile(`(amqps?://[^:/@\s]*):[^@\s]*@`)

// Redact hides the password of every amqp(s) URL inside s. Use it on any
// string that may hold a URL before it reaches output or a log.
func Redact(s string) string {
	return passwordRE.ReplaceAllString(s, "$1:***@")
}

// Dial opens a connection whose client-provided name is name, so operators
// can find it in the management UI. Errors never contain the password.
func Dial(url, name string) (*amqp.Connection, error) {
	cfg := amqp.Config{
		Properties: amqp.NewConnectionProperties(),
		Heartbeat:  10 * time.Second,
	}
	cfg.Properties.SetClientConnectionName(name)
	conn, err := amqp.DialConfig(url, cfg)
	if err != nil {
		return nil, redactedError{err}
	}
	return conn, nil
}

type redactedError struct{ err error }

func (e redactedError) Error() string { return Redact(e.err.Error()) }
func (e redactedError) Unwrap() error { return e.err }
