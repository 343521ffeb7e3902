package topology

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// A refusal because the management API is another broker's must say so to
// errors.Is as well as to ErrDeleteNeedsManagement: the doc promises the
// error wraps the cause.
func TestDeleteRefusalWrapsCause(t *testing.T) {
	cause := fmt.Errorf("management API at x is of cluster %q: %w", "b", ErrOtherBroker)
	in := &Broker{mgmtErr: cause}
	_, err := in.Delete(context.Background(), &Topology{}, DeleteOptions{})
	if !errors.Is(err, ErrDeleteNeedsManagement) {
		t.Fatalf("err = %v, want ErrDeleteNeedsManagement", err)
	}
	if !errors.Is(err, ErrOtherBroker) {
		t.Fatalf("err = %v, want it to wrap ErrOtherBroker", err)
	}
}
