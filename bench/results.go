package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Figure is one key of results.json: a ratio against a baseline measured in the same run,
// or a latency, time or size with the baseline it is read against named in Against.
type Figure struct {
	Key   string  `json:"key"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	// Goal is the goal ("≥ 0.8", "≤ 0.3"); empty when informational.
	Goal string `json:"goal,omitempty"`
	// Met is whether Value meets Goal (nil without one).
	Met *bool `json:"met,omitempty"`
	// Against says what was measured and against which baseline.
	Against string `json:"against"`
}

// Results is what a run measured.
type Results struct {
	Started  time.Time         `json:"started"`
	Machine  map[string]string `json:"machine"`
	Figures  []Figure          `json:"figures"`
	Problems []string          `json:"problems,omitempty"`
	// Raw holds the measurements the figures come from (loadgen results, CPU deltas…).
	Raw map[string]any `json:"raw"`
}

func newResults() *Results {
	host, _ := os.Hostname()
	return &Results{
		Started: time.Now().UTC(),
		Machine: map[string]string{"cpus": fmt.Sprint(runtime.NumCPU()), "go": runtime.Version(), "host": host},
		Raw:     map[string]any{},
	}
}

// add records a figure; goal is "" or "≥ x" / "≤ x".
func (r *Results) add(key string, value float64, unit, goal, against string) {
	f := Figure{Key: key, Value: round(value), Unit: unit, Goal: goal, Against: against}
	if goal != "" {
		var want float64
		op, num, _ := strings.Cut(goal, " ")
		if _, err := fmt.Sscan(num, &want); err == nil {
			met := (op == "≥" && value >= want) || (op == "≤" && value <= want)
			f.Met = &met
		}
	}
	r.Figures = append(r.Figures, f)
}

// problem records a measurement that could not be taken: the run goes on with the others.
func (r *Results) problem(what string, err error) {
	r.Problems = append(r.Problems, fmt.Sprintf("%s: %v", what, err))
}

// Value returns a figure's value.
func (r *Results) Value(key string) (float64, bool) {
	for _, f := range r.Figures {
		if f.Key == key {
			return f.Value, true
		}
	}
	return 0, false
}

func round(v float64) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	digits := 3 - int(math.Floor(math.Log10(math.Abs(v))))
	if digits < 0 {
		digits = 0
	}
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// Print writes the table.
func (r *Results) Print(w io.Writer) {
	fmt.Fprintf(w, "\nmetergate bench, %s, %s CPUs, %s\n\n", r.Started.Format(time.RFC3339), r.Machine["cpus"], r.Machine["go"])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "key\tvalue\tgoal\t\tmeasured against")
	fmt.Fprintln(tw, "---\t-----\t----\t\t----------------")
	for _, f := range r.Figures {
		verdict := ""
		if f.Met != nil {
			verdict = "MISSED"
			if *f.Met {
				verdict = "met"
			}
		}
		fmt.Fprintf(tw, "%s\t%s %s\t%s\t%s\t%s\n", f.Key, fmt.Sprint(f.Value), f.Unit, f.Goal, verdict, f.Against)
	}
	tw.Flush()
	for _, p := range r.Problems {
		fmt.Fprintf(w, "NOT MEASURED: %s\n", p)
	}
}

// Write writes results.json: the figures by key, then the whole record.
func (r *Results) Write(path string) error {
	byKey := map[string]float64{}
	for _, f := range r.Figures {
		byKey[f.Key] = f.Value
	}
	out := struct {
		ByKey map[string]float64 `json:"results"`
		*Results
	}{byKey, r}
	raw, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}

// spread is a figure's interleaved samples: the median, reported with the minimum and
// maximum (raw keeps every sample).
type spread struct {
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	Samples []float64 `json:"samples"`
}

func spreadOf(samples []float64) spread {
	if len(samples) == 0 {
		return spread{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{Median: med, Min: s[0], Max: s[len(s)-1], Samples: samples}
}

// String is "median of n (min a, max b)".
func (s spread) String() string {
	return fmt.Sprintf("median of %d interleaved samples (min %v, max %v)", len(s.Samples), round(s.Min), round(s.Max))
}

// addSpread records a figure whose value is the median of interleaved samples; the
// samples go to raw["samples"][key].
func (r *Results) addSpread(key string, s spread, unit, goal, against string) {
	r.add(key, s.Median, unit, goal, s.String()+"; "+against)
	samples, _ := r.Raw["samples"].(map[string]spread)
	if samples == nil {
		samples = map[string]spread{}
		r.Raw["samples"] = samples
	}
	samples[key] = s
}
