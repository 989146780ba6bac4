//go:build !linux

package testutil

import "os/exec"

// StartTied starts cmd and returns a channel closed once it has exited
// and been waited for. Only Linux can tie a child's life to the test
// binary's (see the Linux StartTied).
func StartTied(cmd *exec.Cmd) (<-chan struct{}, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	return done, nil
}
