package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSDKOverhead(t *testing.T) {
	t.Parallel()
	// 20 samples each, out of order: p50 is the 10th smallest, p95 the 19th.
	m := sdkMeasure{Name: "x"}
	for i := range 20 {
		j := (i * 7) % 20
		m.SDKMS = append(m.SDKMS, 1.05+float64(j)/10)
		m.RawMS = append(m.RawMS, 1+float64(j)/10)
	}
	o, err := m.overhead()
	require.NoError(t, err)
	require.Equal(t, 20, o.N)
	require.InDelta(t, 1.95, o.P50, 1e-9)
	require.InDelta(t, 1.9, o.RawP50, 1e-9)
	require.InDelta(t, 2.85, o.P95, 1e-9)
	require.InDelta(t, 2.8, o.RawP95, 1e-9)
	require.InDelta(t, 0.05, o.AddedP50, 1e-9)
	require.InDelta(t, 1.95/1.9, o.Ratio, 1e-9)

	// A middleware's: the raw admit's p50 is taken off what the middleware adds.
	m.Kind, m.AdmitMS = kindMiddleware, []float64{0.01}
	_, err = m.overhead()
	require.ErrorContains(t, err, "x: 1 samples of the raw admit, 20 of the subject")
	m.AdmitMS = nil
	for i := range 20 {
		m.AdmitMS = append(m.AdmitMS, 0.02-float64(i)/1000) // p50: the 10th smallest, 0.01
	}
	o, err = m.overhead()
	require.NoError(t, err)
	require.InDelta(t, 0.01, o.AdmitP50, 1e-9)
	require.InDelta(t, 0.04, o.BeyondAdmitP50, 1e-9)
	m.Kind = "other"
	_, err = m.overhead()
	require.ErrorContains(t, err, `unknown kind "other"`)

	_, err = sdkMeasure{Name: "short", SDKMS: []float64{1, 2}, RawMS: []float64{1}}.overhead()
	require.ErrorContains(t, err, "short: 2 samples of the subject, 1 of the baseline")
	_, err = sdkMeasure{Name: "empty"}.overhead()
	require.Error(t, err)
}

func TestParseSDKOutput(t *testing.T) {
	t.Parallel()
	out, err := parseSDKOutput([]byte("a warning first\n" +
		`{"sdk":"python","version":"3.11.7","measures":[{"name":"python_client","subject":"s","baseline":"b","sdk_ms":[1.5],"raw_ms":[1.25]}]}` + "\n\n"))
	require.NoError(t, err)
	require.Equal(t, "python", out.SDK)
	require.Equal(t, []sdkMeasure{{Name: "python_client", Subject: "s", Baseline: "b", SDKMS: []float64{1.5}, RawMS: []float64{1.25}}}, out.Measures)

	_, err = parseSDKOutput([]byte(`{"sdk":"python","measures":[]}`))
	require.ErrorContains(t, err, "without measures")
	_, err = parseSDKOutput([]byte("Traceback (most recent call last):\n  boom"))
	require.ErrorContains(t, err, "boom")
}
