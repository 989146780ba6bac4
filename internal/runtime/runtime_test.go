package runtime

import "testing"

func TestRestorable(t *testing.T) {
	for _, tc := range []struct {
		saved, running string
		want           bool
	}{
		{"v1", "v1", true},
		{"v1", "v2", false},
		{"", "v2", true},
		{UnstampedVersion, "v2", true},
		{"v2", UnstampedVersion, false},
	} {
		if got := Restorable(tc.saved, tc.running); got != tc.want {
			t.Errorf("Restorable(%q, %q) = %v, want %v", tc.saved, tc.running, got, tc.want)
		}
	}
}
