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

func TestReadySleepIgnoresAStaleTimer(t *testing.T) {
	r := &readyShells{idleAfter: time.Hour}
	defer r.close()
	r.touch()
	stale := r.idleGen
	// A command since (or an /init) moved the idle timer on: the one armed
	// before, firing late, must not drop the shell.
	r.touch()
	r.sleep(stale)
	if r.dormant {
		t.Fatal("a stale idle timer made the sandbox dormant")
	}
	r.sleep(r.idleGen)
	if !r.dormant {
		t.Fatal("the current idle timer did not make the sandbox dormant")
	}
}
