package envd

import (
	"os"
	"testing"
)

func TestShellFallback(t *testing.T) {
	// On this host /bin/bash exists, so the command is kept as asked.
	if _, err := os.Stat("/bin/bash"); err == nil {
		if got := shellFallback("/bin/bash"); got != "/bin/bash" {
			t.Fatalf("shellFallback(/bin/bash) = %q with bash present", got)
		}
	}
	if got := shellFallback("/usr/bin/python3"); got != "/usr/bin/python3" {
		t.Fatalf("shellFallback changed a non-shell command: %q", got)
	}
}
