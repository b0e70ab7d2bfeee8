package conformance

import (
	"slices"
	"testing"
)

// TestOnly: Harness.Only keeps the areas and cases it names, all of them
// when empty or overridden, and reports names that select nothing.
func TestOnly(t *testing.T) {
	cases := []testCase{{name: "Acquire/Basic"}, {name: "Acquire/Twice"}, {name: "AcquireX/Y"}, {name: "Loss/Cut"}, {name: "Loss/Steal"}}
	names := func(cs []testCase) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.name)
		}
		return out
	}
	for _, tc := range []struct {
		only    []string
		full    bool
		want    []string
		unknown []string
	}{
		{nil, false, []string{"Acquire/Basic", "Acquire/Twice", "AcquireX/Y", "Loss/Cut", "Loss/Steal"}, nil},
		{[]string{"Acquire"}, false, []string{"Acquire/Basic", "Acquire/Twice"}, nil},
		{[]string{"Acquire", "Loss/Steal"}, false, []string{"Acquire/Basic", "Acquire/Twice", "Loss/Steal"}, nil},
		{[]string{"Acquire", "Nope", "Loss/Nope"}, false, []string{"Acquire/Basic", "Acquire/Twice"}, []string{"Nope", "Loss/Nope"}},
		{[]string{"Acquire"}, true, []string{"Acquire/Basic", "Acquire/Twice", "AcquireX/Y", "Loss/Cut", "Loss/Steal"}, nil},
	} {
		kept, unknown := only(cases, tc.only, tc.full)
		if got := names(kept); !slices.Equal(got, tc.want) || !slices.Equal(unknown, tc.unknown) {
			t.Errorf("only(%v, full %t) = %v, unknown %v; want %v, unknown %v", tc.only, tc.full, got, unknown, tc.want, tc.unknown)
		}
	}
}
