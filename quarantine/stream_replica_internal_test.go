package quarantine

import (
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A stream read refused on a node without a running replica (4.3.6's
// words, seen on a node just restarted) says so, not "is it a stream?".
func TestConsumeErrorNamesAMissingLocalReplica(t *testing.T) {
	t.Parallel()
	refused := &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - stream queue 'q.records' in vhost '/' does not have a running replica on the local node"}
	err := consumeError("q.records", refused)
	if !errors.Is(err, refused) || !strings.Contains(err.Error(), "no running replica") || strings.Contains(err.Error(), "is it a stream") {
		t.Errorf("consumeError = %v", err)
	}
	other := &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no queue 'q.records' in vhost '/'"}
	if err := consumeError("q.records", other); !errors.Is(err, other) || !strings.Contains(err.Error(), "is it a stream? was the topology applied?") {
		t.Errorf("consumeError(404) = %v", err)
	}
}
