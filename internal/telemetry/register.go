package telemetry

import "github.com/prometheus/client_golang/prometheus"

// Register registers cs on reg in order and stops at the first error. With
// a nil reg it registers nothing: the collectors then count for no one,
// which is what a nil Registerer means throughout dlxbridge.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
