//go:build !linux

package s3gw

import "os/exec"

func setPdeathsig(cmd *exec.Cmd) {}
