package config_test

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/config"
)

func TestMeterDefaultsAndSettings(t *testing.T) {
	var c config.Meter
	_, err := config.Load(&c, "meter", nil, envMap(nil), io.Discard)
	require.NoError(t, err)
	require.Equal(t, "metergate-meter", c.Group)
	require.Equal(t, 1000, c.BatchSize)
	require.Equal(t, 200*time.Millisecond, c.BatchWait)
	require.Equal(t, 30*time.Second, c.SessionTimeout)

	c = config.Meter{}
	_, err = config.Load(&c, "meter", []string{"-meter-batch-wait", "50ms"}, envMap(map[string]string{
		"METER_BATCH_SIZE": "250", "METER_BATCH_WAIT": "1s", "METER_SESSION_TIMEOUT": "6s",
	}), io.Discard)
	require.NoError(t, err)
	require.Equal(t, 250, c.BatchSize)
	require.Equal(t, 50*time.Millisecond, c.BatchWait, "a flag wins over its variable")
	require.Equal(t, 6*time.Second, c.SessionTimeout)
}

func TestMeterBadSettingsAreNamed(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"batch size 0", map[string]string{"METER_BATCH_SIZE": "0"}, "meter: METER_BATCH_SIZE=0: want 1-100000"},
		{"batch size too large", map[string]string{"METER_BATCH_SIZE": "1000000"}, "meter: METER_BATCH_SIZE=1000000: want 1-100000"},
		{"batch size not a number", map[string]string{"METER_BATCH_SIZE": "many"}, `METER_BATCH_SIZE="many": not an integer`},
		{"batch wait 0", map[string]string{"METER_BATCH_WAIT": "0s"}, "meter: METER_BATCH_WAIT=0s: want more than 0 and at most 1m"},
		{"batch wait negative", map[string]string{"METER_BATCH_WAIT": "-1s"}, "meter: METER_BATCH_WAIT=-1s"},
		{"batch wait too long", map[string]string{"METER_BATCH_WAIT": "2m"}, "meter: METER_BATCH_WAIT=2m0s"},
		{"batch wait not a duration", map[string]string{"METER_BATCH_WAIT": "soon"}, `METER_BATCH_WAIT="soon": not a duration`},
		{"session timeout too short", map[string]string{"METER_SESSION_TIMEOUT": "100ms"}, "meter: METER_SESSION_TIMEOUT=100ms: want 1s-30m"},
		{"empty group", map[string]string{"METER_GROUP": ""}, "meter: METER_GROUP: must not be empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c config.Meter
			_, err := config.Load(&c, "meter", nil, envMap(tt.env), io.Discard)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
		})
	}

	// Every bad meter setting is reported at once.
	var c config.Meter
	_, err := config.Load(&c, "meter", nil, envMap(map[string]string{
		"METER_BATCH_SIZE": "0", "METER_BATCH_WAIT": "0s", "METER_SESSION_TIMEOUT": "0s",
	}), io.Discard)
	for _, name := range []string{"METER_BATCH_SIZE", "METER_BATCH_WAIT", "METER_SESSION_TIMEOUT"} {
		require.ErrorContains(t, err, name)
	}
}
