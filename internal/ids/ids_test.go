package ids

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{New(), true},
		{"a", true},
		{strings.Repeat("z9", 32), true},
		{"", false},
		{strings.Repeat("a", MaxLen+1), false},
		{strings.Repeat("a", 64<<10), false},
		{"ABC", false},
		{"a-b", false},
		{"../x", false},
		{"a\x00", false},
		{"é", false},
	} {
		if got := Valid(tc.id); got != tc.ok {
			t.Errorf("Valid(%.12q) = %v, want %v", tc.id, got, tc.ok)
		}
	}
}
