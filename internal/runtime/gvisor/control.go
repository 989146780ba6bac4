package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The sandbox process's control server methods a pause uses. A freeze
// through it takes well under a millisecond; `runsc pause` and `runsc
// resume` took 16 ms each here, most of it the start of the 100 MB runsc
// binary, on every pause.
const (
	controlPause  = "containerManager.Pause"
	controlResume = "containerManager.Resume"
	// controlTimeout bounds one call; a freeze waits for every task to
	// stop, which is quick unless the host is starved.
	controlTimeout = 30 * time.Second
)

// frozenMarkerName, in a sandbox's directory, says that this driver froze it
// through the control server (runsc's own state still says running), so
// that a process that died before thawing it lets its successor's
// Recover thaw it. It is written before the freeze: a resume of a kernel
// that is not paused panics gVisor's sentry, so the marker may only be
// missing when the sandbox certainly is not frozen.
const frozenMarkerName = "frozen"

// controlCall is one call to the sandbox's control server: gVisor's urpc,
// one JSON object each way over the unix socket the sandbox process
// serves. It is written here rather than imported because gVisor's client
// (pkg/urpc) links into the Go runtime through gVisor's sync package,
// which builds only with -checklinkname=0.
type controlCall struct {
	Method string `json:"method"`
	Arg    any    `json:"arg"`
}

type controlResult struct {
	Success bool   `json:"success"`
	Err     string `json:"err"`
}

// errNotSent is a call that never reached the sandbox process.
var errNotSent = errors.New("the control call was not sent")

// unixPathMax is the size of a unix socket address's path (sun_path),
// its terminating NUL included.
const unixPathMax = 108

// control calls method, which takes no argument, on sandbox id's control
// server.
func (d *Driver) control(ctx context.Context, id, method string) error {
	sock, err := d.controlSocket(id)
	if err != nil {
		return fmt.Errorf("%w: %w", errNotSent, err)
	}
	if len(sock) >= unixPathMax {
		// Too long for a unix address: reached through a descriptor of
		// it, as runsc does.
		fd, err := unix.Open(sock, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: opening %s: %w", errNotSent, sock, err)
		}
		defer unix.Close(fd)
		sock = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), controlTimeout)
	defer cancel()
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", sock)
	if err != nil {
		return fmt.Errorf("%w: %w", errNotSent, err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	req, err := json.Marshal(controlCall{Method: method})
	if err != nil {
		return err
	}
	if _, err := conn.Write(req); err != nil {
		// The server acts on a whole request only.
		return fmt.Errorf("%w: calling %s: %w", errNotSent, method, err)
	}
	var res controlResult
	if err := json.NewDecoder(conn).Decode(&res); err != nil {
		return fmt.Errorf("calling %s: reading the answer: %w", method, err)
	}
	if !res.Success {
		return fmt.Errorf("calling %s: %s", method, res.Err)
	}
	return nil
}

// controlSocket is where sandbox id's process serves its control server,
// as runsc recorded it in the container's state file.
func (d *Driver) controlSocket(id string) (string, error) {
	b, err := os.ReadFile(filepath.Join(d.runc.Root, id+"_sandbox:"+id+".state"))
	if err != nil {
		return "", fmt.Errorf("reading runsc's state of %s: %w", id, err)
	}
	var st struct {
		Sandbox struct {
			ControlSocketPath string `json:"controlSocketPath"`
		} `json:"sandbox"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return "", fmt.Errorf("reading runsc's state of %s: %w", id, err)
	}
	p := st.Sandbox.ControlSocketPath
	if p == "" {
		return "", fmt.Errorf("runsc's state of %s names no control socket", id)
	}
	return p, nil
}

// freeze stops every task of sandbox id until Thaw.
func (d *Driver) freeze(ctx context.Context, id string) error {
	marker := d.frozenMarker(id)
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		return fmt.Errorf("freezing %s: %w", id, err)
	}
	if err := d.control(ctx, id, controlPause); err != nil {
		if errors.Is(err, errNotSent) {
			os.Remove(marker)
		}
		return fmt.Errorf("freezing %s: %w", id, err)
	}
	return nil
}

// Thaw implements runtime.Checkpointer: it lets sandbox id, frozen by
// freeze, run on.
func (d *Driver) Thaw(ctx context.Context, id string) error {
	if err := d.control(ctx, id, controlResume); err != nil {
		return fmt.Errorf("thawing %s: %w", id, err)
	}
	if err := os.Remove(d.frozenMarker(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("thawing %s: %w", id, err)
	}
	return nil
}

// frozenMarker is where freeze marks sandbox id frozen (frozenMarkerName).
func (d *Driver) frozenMarker(id string) string {
	return filepath.Join(d.sandboxDir(id), frozenMarkerName)
}

// frozen says whether freeze left a marker that no thaw removed.
func (d *Driver) frozen(id string) bool {
	_, err := os.Stat(d.frozenMarker(id))
	return err == nil
}
