package backend

import "testing"

// StripParams keeps the other parameters byte for byte.
func TestStripParams(t *testing.T) {
	for raw, want := range map[string]string{
		"":                                  "",
		"lock_namespace=x":                  "",
		"a=1&lock_ddl=false&b=%2B+c":        "a=1&b=%2B+c",
		"lock%5Fnamespace=x&options=-c%20a": "options=-c%20a",
		"LOCK_DDL=false&x=1":                "x=1",
		"&&a=1&":                            "a=1",
		"block_x=1&lock=2":                  "block_x=1&lock=2",
	} {
		if got := StripParams(raw, "lock_"); got != want {
			t.Errorf("StripParams(%q, \"lock_\") = %q, want %q", raw, got, want)
		}
	}
}
