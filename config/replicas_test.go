package config_test

import (
	"strings"
	"testing"

	"github.com/dlxbridge/dlxbridge/config"
)

// broker.replicas parses; 0 (which reads like "no replicas") and a
// negative count are refused; an even count is a warning.
func TestReplicasKeyIsValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		broker, wantErr, wantWarning string
	}{
		{"broker: {replicas: 3}\n", "", ""},
		{"broker: {replicas: 4}\n", "", "broker.replicas: 4 is even"},
		{"broker: {replicas: 0}\n", "broker.replicas: 0 is not allowed", ""},
		{"broker: {replicas: -1}\n", "broker.replicas: must be >= 1", ""},
		{"", "", ""},
	} {
		cfg, err := config.Parse([]byte(tc.broker + queueDoc("")))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want %q", tc.broker, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.broker, err)
			continue
		}
		ws := cfg.Warnings().Error()
		if (tc.wantWarning == "") != (ws == "") || !strings.Contains(ws, tc.wantWarning) {
			t.Errorf("%q: warnings %q, want %q", tc.broker, ws, tc.wantWarning)
		}
	}
}
