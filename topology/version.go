package topology

import (
	"fmt"
	"strconv"
	"strings"
)

// BrokerVersion is the RabbitMQ version a topology is built for, read from
// the connection's server properties ("version").
type BrokerVersion struct {
	Major, Minor, Patch int
}

// ParseBrokerVersion parses "3.10.8", "4.0.5" or "4.1.0-rc.1".
func ParseBrokerVersion(s string) (BrokerVersion, error) {
	var v BrokerVersion
	core, _, _ := strings.Cut(strings.TrimSpace(s), "-")
	core, _, _ = strings.Cut(core, "+")
	parts := strings.Split(core, ".")
	if len(parts) < 2 {
		return v, fmt.Errorf("broker version %q: want MAJOR.MINOR[.PATCH]", s)
	}
	nums := []*int{&v.Major, &v.Minor, &v.Patch}
	for i, p := range parts {
		if i >= len(nums) {
			break
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return BrokerVersion{}, fmt.Errorf("broker version %q: %q is not a number", s, p)
		}
		*nums[i] = n
	}
	return v, nil
}

// VersionFromProperties reads the version from AMQP server properties
// (amqp.Connection.Properties).
func VersionFromProperties(props map[string]any) (BrokerVersion, error) {
	raw, ok := props["version"]
	if !ok {
		return BrokerVersion{}, fmt.Errorf("server properties carry no version")
	}
	s, ok := raw.(string)
	if !ok {
		return BrokerVersion{}, fmt.Errorf("server version has type %T, want string", raw)
	}
	return ParseBrokerVersion(s)
}

func (v BrokerVersion) String() string {
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
}

// AtLeast reports whether v >= major.minor.
func (v BrokerVersion) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// HasDefaultDeliveryLimit: 4.0+ applies a delivery limit of 20 to every
// quorum queue unless it is set to -1.
func (v BrokerVersion) HasDefaultDeliveryLimit() bool { return v.Major >= 4 }
