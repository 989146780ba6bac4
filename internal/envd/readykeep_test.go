package envd

import (
	"testing"
	"time"
)

func TestReadyKeepFollowsPauses(t *testing.T) {
	const idle = 20 * time.Second
	for _, c := range []struct {
		name   string
		pauses []time.Duration
		want   time.Duration
	}{
		{"no command yet", nil, idle},
		{"short pauses keep the idle period", []time.Duration{time.Second, 3 * time.Second}, idle},
		{"twice the longest recent pause", []time.Duration{5 * time.Second, 40 * time.Second, 12 * time.Second}, 80 * time.Second},
		{"at most the cap", []time.Duration{time.Hour}, readyShellKeepMax * idle},
	} {
		if got := readyKeep(idle, c.pauses); got != c.want {
			t.Errorf("%s: readyKeep(%v, %v) = %v, want %v", c.name, idle, c.pauses, got, c.want)
		}
	}
}
