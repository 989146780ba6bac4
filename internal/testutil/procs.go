package testutil

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// Gofers counts the gVisor gofer processes whose command line holds
// within (a runsc root or a server's run directory): runsc names its
// processes by their part, runsc-gofer and runsc-sandbox.
func Gofers(t testing.TB, within string) int {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if bytes.HasPrefix(b, []byte("runsc-gofer\x00")) && bytes.Contains(b, []byte(within)) {
			n++
		}
	}
	return n
}
