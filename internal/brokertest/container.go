package brokertest

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcrabbit "github.com/testcontainers/testcontainers-go/modules/rabbitmq"
)

// ContainerImage is the broker image used when RABBITMQ_URL is unset.
const ContainerImage = "rabbitmq:4-management"

// startContainer starts one broker container for the whole test binary. It
// is reaped by testcontainers' Ryuk when the process exits.
func startContainer() (b broker) {
	if os.Getenv("DLXBRIDGE_NO_DOCKER") != "" {
		return broker{skip: "RABBITMQ_URL is unset and DLXBRIDGE_NO_DOCKER forbids a container"}
	}
	defer func() {
		// testcontainers panics in some environments without Docker.
		if r := recover(); r != nil {
			b = broker{skip: fmt.Sprintf("RABBITMQ_URL is unset and no Docker engine answers (%v)", r)}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := testcontainers.NewDockerClientWithOpts(ctx); err != nil {
		return broker{skip: "RABBITMQ_URL is unset and no Docker engine answers: " + err.Error()}
	}
	c, err := tcrabbit.Run(ctx, ContainerImage)
	if err != nil {
		return broker{skip: "RABBITMQ_URL is unset and the " + ContainerImage + " container did not start: " + err.Error()}
	}
	u, err := c.AmqpURL(ctx)
	if err != nil {
		return broker{err: fmt.Errorf("container AMQP URL: %w", err)}
	}
	m, _ := c.HttpURL(ctx)
	return broker{url: u, mgmt: m}
}
