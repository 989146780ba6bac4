package testutil

import (
	"os/exec"
	"runtime"
	"syscall"
)

// StartTied starts cmd so that the kernel kills it (SIGKILL) when the test
// binary dies, leaving no server behind a crashed run, and returns a
// channel closed once cmd has exited and been waited for.
//
// Linux sends a child's parent-death signal when the thread that forked it
// ends, not the process (golang/go#27505), and the Go runtime ends a
// thread whenever a goroutine locked to it returns, as the code under test
// does (the gVisor driver forks a pool's runsc from a thread of its own at
// a lower priority): a child forked from such a thread was killed mid-test.
// So cmd is forked, and waited for, on a thread locked for its whole life.
func StartTied(cmd *exec.Cmd) (<-chan struct{}, error) {
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		close(done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}
