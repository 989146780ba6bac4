//go:build aenv_runsc_main

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"gvisor.dev/gvisor/pkg/log"
	"gvisor.dev/gvisor/pkg/sentry/control"
	"gvisor.dev/gvisor/pkg/state/statefile"
	"gvisor.dev/gvisor/runsc/config"
	"gvisor.dev/gvisor/runsc/container"
	"gvisor.dev/gvisor/runsc/flag"
	"gvisor.dev/gvisor/runsc/sandbox"
	"gvisor.dev/gvisor/runsc/specutils"
)

// serveCommand, runsc's first argument, makes the process a server of
// restores into created containers, checkpoints and forced deletes, for
// aenv's gVisor driver: `runsc aenv-serve FLAGS...`, where FLAGS are runsc's
// global flags (--root and the rest). It serves requests on the unix
// listener it is given as descriptor 3, one request and one reply per
// connection (serveRequest, serveReply), and ends once descriptor 4, a
// pipe's read end, reads end of file: the driver holds the write end, so
// the server outlives neither a Close nor a crash of the driver's
// process. What it is serving when that comes is finished first.
//
// Why: every `runsc restore`, `runsc checkpoint` and `runsc delete` is a
// start of this 100 MB static binary, ~21 CPU-ms and ~1,000 page faults
// here before it does anything, on the critical path of a resume, a
// pause, a fork and each of its children. The server runs the code of
// those commands (container.Load, then Restore, Checkpoint or Destroy) in
// one process that has already started.
const serveCommand = "aenv-serve"

// serveEdit is what `runsc aenv-edits` lists for this command.
const serveEdit = "serve"

// Descriptors the server is started with.
const (
	serveListenerFD = 3
	serveParentFD   = 4
)

// serveRequest is one request, on container ID: Op is "restore" (of a
// created container, from the checkpoint in ImagePath), "checkpoint"
// (into ImagePath, the container left running if LeaveRunning) or
// "delete" (as `runsc delete --force`: a container that is not there is
// no error). Root is the runsc root the sender means, which must be the
// server's: a delete sent to another root's server would find nothing to
// delete and succeed. Flags are runsc's global flags for this request,
// after the server's own, as the same command line would carry them.
type serveRequest struct {
	Op           string   `json:"op"`
	Root         string   `json:"root"`
	ID           string   `json:"id"`
	ImagePath    string   `json:"imagePath,omitempty"`
	LeaveRunning bool     `json:"leaveRunning,omitempty"`
	Flags        []string `json:"flags,omitempty"`
}

// serveReply is the answer: Err is empty on success.
type serveReply struct {
	Err string `json:"err,omitempty"`
}

// serve runs the server with runsc's global flags args, until the driver
// is gone.
func serve(args []string) error {
	// The commands' own logs go where a command's go without --debug-log.
	log.SetTarget(log.GoogleEmitter{Writer: &log.Writer{Next: io.Discard}})
	if _, err := newConfig(args, nil); err != nil {
		return err
	}
	l, err := net.FileListener(os.NewFile(serveListenerFD, "listener"))
	if err != nil {
		return fmt.Errorf("%s: the listener (descriptor %d): %w", serveCommand, serveListenerFD, err)
	}
	go func() {
		// Anything read, or end of file, or an error: the driver is gone.
		io.Copy(io.Discard, os.NewFile(serveParentFD, "parent"))
		l.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("%s: accepting: %w", serveCommand, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			var req serveRequest
			if err := json.NewDecoder(conn).Decode(&req); err != nil {
				return
			}
			var rep serveReply
			if err := handle(args, req); err != nil {
				rep.Err = err.Error()
			}
			json.NewEncoder(conn).Encode(rep)
		}()
	}
}

// newConfig is runsc's configuration from global flags args and then
// extra, as a command line carrying both would make it.
func newConfig(args, extra []string) (*config.Config, error) {
	fs := flag.NewFlagSet(serveCommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	config.RegisterFlags(fs)
	if err := fs.Parse(append(append([]string(nil), args...), extra...)); err != nil {
		return nil, fmt.Errorf("%s: parsing flags: %w", serveCommand, err)
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("%s: unexpected arguments %q", serveCommand, fs.Args())
	}
	return config.NewFromFlags(fs)
}

// handle does what `runsc restore --image-path=P ID` of a created
// container, `runsc checkpoint --image-path=P [--leave-running] ID` or
// `runsc delete --force ID` does once it has parsed its command line
// (runsc/cmd's Restore, Checkpoint and Delete, and cli.Run before them:
// the configuration fixed by the container's spec), with those commands'
// defaults for every flag aenv's driver does not pass. A panic in them
// ends the server rather than being recovered: a container's state file
// lock it held would otherwise stay held by the server for good.
func handle(args []string, req serveRequest) error {
	conf, err := newConfig(args, req.Flags)
	if err != nil {
		return err
	}
	if req.Root != conf.RootDir {
		return fmt.Errorf("this server serves runsc root %q, not %q", conf.RootDir, req.Root)
	}
	c, err := container.Load(conf.RootDir, container.FullID{ContainerID: req.ID}, container.LoadOpts{})
	if req.Op == "delete" && errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("loading container %q: %w", req.ID, err)
	}
	if err := specutils.FixConfig(conf, c.Spec); err != nil {
		return fmt.Errorf("applying the spec's annotations to the configuration: %w", err)
	}
	switch req.Op {
	case "restore":
		if req.ImagePath == "" {
			return errors.New("restore: no image path")
		}
		// Without --direct and in the foreground, as aenv's driver runs
		// `runsc restore`.
		if err := c.Restore(conf, req.ImagePath, false, false, nil); err != nil {
			return fmt.Errorf("starting container: %w", err)
		}
		return nil
	case "checkpoint":
		if req.ImagePath == "" {
			return errors.New("checkpoint: no image path")
		}
		if err := os.MkdirAll(req.ImagePath, 0o755); err != nil {
			return fmt.Errorf("making directories at path provided: %w", err)
		}
		opts := sandbox.CheckpointOpts{
			Compression:                statefile.CompressionLevelDefault,
			Resume:                     req.LeaveRunning,
			SaveRestoreExecTimeout:     control.DefaultSaveRestoreExecTimeout,
			SaveRestoreExecContainerID: c.ID,
		}
		if err := c.Checkpoint(conf, req.ImagePath, opts); err != nil {
			return fmt.Errorf("checkpoint failed: %w", err)
		}
		return nil
	case "delete":
		if err := c.Destroy(); err != nil {
			return fmt.Errorf("destroying container: %w", err)
		}
		return nil
	}
	return fmt.Errorf("unknown op %q", req.Op)
}
