package envd

import (
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// The bootstrap reads up to readyReadMax: the largest command and the
// largest header, which the longest host name must fit.
func TestReadyReadMaxHoldsHeaderAndScript(t *testing.T) {
	n, err := strconv.Atoi(readyReadMax)
	if err != nil || n != readyShellMaxScript+readyHeaderMax {
		t.Fatalf("readyReadMax = %q, want %d", readyReadMax, readyShellMaxScript+readyHeaderMax)
	}
	if h := readyHeader(1<<31-1, strings.Repeat("'", 64)); len(h) > readyHeaderMax {
		t.Fatalf("a 64-byte host name makes a %d-byte header, over %d", len(h), readyHeaderMax)
	}
}

// readyHeader's assignments reach the command through readyBootstrap as
// they should, whatever the host name holds, and leave the command's line
// numbers and status as bash -c gives them.
func TestReadyHeaderThroughBootstrap(t *testing.T) {
	for _, host := range []string{"sbx1", "it's", `a"b$c`} {
		script := "echo \"$HOSTNAME|$?|$LINENO|${__aenv_cmd-unset}\"\necho $LINENO $SECONDS\nexit 3"
		cmd := exec.Command("/bin/bash", "-c", "exec 3<&0; "+readyBootstrap)
		cmd.Stdin = strings.NewReader(readyHeader(12345, host) + script)
		out, err := cmd.Output()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 3 {
			t.Fatalf("host %q: err %v, want exit status 3", host, err)
		}
		if want := host + "|0|1|unset\n2 0\n"; string(out) != want {
			t.Fatalf("host %q: printed %q, want %q", host, out, want)
		}
	}
	// The same seed gives the same numbers, as `RANDOM=seed` does.
	want, err := exec.Command("/bin/bash", "-c", "RANDOM=12345; echo $RANDOM $RANDOM").Output()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/bash", "-c", "exec 3<&0; "+readyBootstrap)
	cmd.Stdin = strings.NewReader(readyHeader(12345, "h") + "echo $RANDOM $RANDOM")
	out, err := cmd.Output()
	if err != nil || string(out) != string(want) {
		t.Fatalf("seeded output %q (%v), want %q", out, err, want)
	}
}
