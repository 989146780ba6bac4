package envd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aenvhq/aenv/internal/envd"
	"github.com/aenvhq/aenv/internal/envd/spec/process"
)

// TestReapsOrphans checks that with ReapAll (envd as PID 1) an orphan
// re-parented to envd does not stay a zombie, while envd's own processes
// still get their exit statuses. It runs in a child process made a
// subreaper, standing in for PID 1, so that reaping every child cannot
// disturb the rest of the test binary.
func TestReapsOrphans(t *testing.T) {
	if mode := os.Getenv("ENVD_REAPER_HELPER"); mode != "" {
		reaperHelper(t, mode == "reap")
		return
	}
	for mode, want := range map[string]string{"reap": "gone", "noreap": "Z"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReapsOrphans$", "-test.v")
		cmd.Env = append(os.Environ(), "ENVD_REAPER_HELPER="+mode)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s helper failed: %v\n%s", mode, err, out)
		}
		if !strings.Contains(string(out), "ORPHAN="+want+"\n") {
			t.Fatalf("%s: want ORPHAN=%s in\n%s", mode, want, out)
		}
	}
}

func reaperHelper(t *testing.T, reapAll bool) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("becoming a subreaper: %v", err)
	}
	e := newEnv(t, func(o *envd.Options) { o.ReapAll = reapAll })
	r := e.run(bashCmd("sleep 0.3 >/dev/null 2>&1 & echo $!; exit 5"), "")
	if r.end.GetExitCode() != 5 {
		t.Fatalf("own process: end %v", r.end)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(r.stdout.String()))
	if err != nil {
		t.Fatalf("orphan pid %q: %v", r.stdout.String(), err)
	}
	// The orphan exits after 0.3s; give a reaper ample time to collect it.
	var state string
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if state = procState(orphan); state == "gone" {
			break
		}
	}
	fmt.Printf("ORPHAN=%s\n", state)
	if state == "Z" {
		// Leave no zombie behind the helper (it exits anyway).
		var ws unix.WaitStatus
		_, _ = unix.Wait4(orphan, &ws, unix.WNOHANG, nil)
	}
}

// procState returns a process's state letter from /proc, or "gone".
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "gone"
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return "?"
	}
	return s[i+2 : i+3]
}

// TestManyExitsAtOnce: processes that end together each get their exit
// status at once, though their SIGCHLDs coalesce: the reaper's safety net
// ticks once a minute, so a status left to it would miss the deadline.
func TestManyExitsAtOnce(t *testing.T) {
	e := newEnv(t)
	const n = 40
	errs := make(chan error, n)
	for i := range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cfg := &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", fmt.Sprintf("sleep 0.5; exit %d", i%7)}}
			s, err := e.proc.Start(ctx, req(e, &process.StartRequest{Process: cfg, Stdin: ptr(false)}, ""))
			if err != nil {
				errs <- err
				return
			}
			r, err := collect(s)
			if err == nil && (r.end == nil || r.end.GetExitCode() != int32(i%7)) {
				err = fmt.Errorf("process %d: end %v, want exit code %d", i, r.end, i%7)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
