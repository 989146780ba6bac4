package s3gw

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel kill cmd if the test binary dies first, so
// a crashed run leaves no server behind.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
