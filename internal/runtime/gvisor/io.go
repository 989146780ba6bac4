package gvisor

import (
	"io"
	"os"
	"os/exec"
)

// fileIO hands one file to runsc as the sandbox's stdout and stderr: the
// sandbox's end of envd's FIFO (see envdlog.go). With --detach runsc
// passes the descriptors on to the sandbox, which keeps them for as long
// as it lives. go-runc offers pipes and /dev/null only, and pipes would
// die with our process.
type fileIO struct{ f *os.File }

func (i *fileIO) Close() error          { return nil }
func (i *fileIO) Stdin() io.WriteCloser { return nil }
func (i *fileIO) Stdout() io.ReadCloser { return nil }
func (i *fileIO) Stderr() io.ReadCloser { return nil }
func (i *fileIO) Set(cmd *exec.Cmd)     { cmd.Stdout, cmd.Stderr = i.f, i.f }
