package benchmark

import (
	"regexp"
	"strings"
	"testing"
)

// benchPattern selects exactly the benchmark it names, level by level, also
// when a name holds regexp syntax (a sub-benchmark "keys=1,clients=8").
func TestBenchPattern(t *testing.T) {
	for _, tc := range []struct {
		name  string
		match []string
		not   []string
	}{
		{"BenchmarkInstructions", []string{"BenchmarkInstructions"}, []string{"BenchmarkInstructionsX", "XBenchmarkInstructions"}},
		{"BenchmarkX/a+b(1)", []string{"BenchmarkX/a+b(1)"}, []string{"BenchmarkX/aab1", "BenchmarkX/a+b(1)x"}},
	} {
		parts := strings.Split(benchPattern(tc.name), "/")
		matches := func(name string) bool {
			levels := strings.Split(name, "/")
			if len(levels) != len(parts) {
				return false
			}
			for i, p := range parts {
				if !regexp.MustCompile(p).MatchString(levels[i]) {
					return false
				}
			}
			return true
		}
		for _, m := range tc.match {
			if !matches(m) {
				t.Errorf("benchPattern(%q) = %q does not select %q", tc.name, benchPattern(tc.name), m)
			}
		}
		for _, m := range tc.not {
			if matches(m) {
				t.Errorf("benchPattern(%q) = %q selects %q too", tc.name, benchPattern(tc.name), m)
			}
		}
	}
}
