//go:build !linux

package store

import "os/exec"

func setPdeathsig(cmd *exec.Cmd) {}
