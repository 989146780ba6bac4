package build

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/aenvhq/aenv/internal/runtime/gvisor"
)

// mountDir is where COPY sources appear inside a step's sandbox; Run
// removes it from the tree before publishing.
const mountDir = ".aenv-build"

// caps is what a step running as root may do, as in a container build.
var caps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// runner runs build steps with runsc, one sandbox per step, each writing
// straight into the staged root filesystem (--overlay2=none).
type runner struct {
	runsc string
	// dir is this build's private directory: runsc's --root and the bundle.
	dir  string
	id   string
	n    int
	log  *slog.Logger
	used bool // some step mounted COPY sources
}

// runSpec is one command to run in the root filesystem.
type runSpec struct {
	argv, env []string
	cwd       string
	uid, gid  uint32
	// mounts are host paths bound read-only at /.aenv-build/srcN.
	mounts []string
}

func newRunner(opts Options) (*runner, error) {
	runsc := opts.RunscPath
	if runsc == "" {
		p, err := exec.LookPath("runsc")
		if err != nil {
			return nil, fmt.Errorf("finding runsc: %w (install it with scripts/install-deps.sh)", err)
		}
		runsc = p
	}
	state := opts.StateDir
	if state == "" {
		state = filepath.Join(os.TempDir(), "aenv-build")
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, fmt.Errorf("creating build state dir: %w", err)
	}
	dir, err := os.MkdirTemp(state, "build-")
	if err != nil {
		return nil, fmt.Errorf("creating build state dir: %w", err)
	}
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	return &runner{runsc: runsc, dir: dir, id: "aenv-build-" + hex.EncodeToString(b[:]), log: opts.Logger}, nil
}

// run runs spec to completion in a fresh sandbox over rootfs, its output
// going to out, and returns its exit code. A cancelled ctx kills it.
func (r *runner) run(ctx context.Context, rootfs string, spec runSpec, out io.Writer) (int, error) {
	r.n++
	id := r.id + "-" + strconv.Itoa(r.n)
	bundle := filepath.Join(r.dir, "bundle")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return -1, err
	}
	if err := writeConfig(bundle, rootfs, spec); err != nil {
		return -1, fmt.Errorf("writing bundle: %w", err)
	}
	if len(spec.mounts) > 0 {
		r.used = true
	}
	cmd := exec.Command(r.runsc, r.globalArgs("run", "--bundle", bundle, id)...)
	cmd.Stdout, cmd.Stderr = out, out
	// A Ctrl-C meant for us must not reach the sandbox half-way; we kill
	// it ourselves.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("starting runsc: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		r.delete(id)
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			err = <-done
		}
		r.delete(id)
		return -1, ctx.Err()
	}
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.delete(id) // in case runsc itself failed half-way
		return ee.ExitCode(), nil
	}
	return -1, fmt.Errorf("running runsc: %w", err)
}

func (r *runner) globalArgs(args ...string) []string {
	return append([]string{
		"--root", filepath.Join(r.dir, "runsc"),
		"--platform=systrap",
		// No network during builds for now; never the host's.
		"--network=none",
		// Writes land in the staged tree itself.
		"--overlay2=none",
	}, args...)
}

// delete removes a step's sandbox, running or not.
func (r *runner) delete(id string) {
	cmd := exec.Command(r.runsc, r.globalArgs("delete", "--force", id)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		r.log.Debug("deleting build sandbox", "id", id, "err", err, "out", string(out))
	}
}

// removeMountPoints deletes the mount points that COPY steps left in the
// tree.
func (r *runner) removeMountPoints(rootfs string) error {
	if !r.used {
		return nil
	}
	p := filepath.Join(rootfs, mountDir)
	fi, err := os.Lstat(p)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return nil // the build made it something else: leave it
	}
	return os.RemoveAll(p)
}

// close removes the build's runsc state. runsc leaves a namespace mount
// (null-netns) in its root; it is peeled off first.
func (r *runner) close() {
	p := filepath.Join(r.dir, "runsc", "null-netns")
	for range 100 {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			break
		}
	}
	if err := os.RemoveAll(r.dir); err != nil {
		r.log.Warn("removing build state", "dir", r.dir, "err", err)
	}
}

// writeConfig writes the OCI config of one step.
func writeConfig(bundle, rootfs string, spec runSpec) error {
	proc := &specs.Process{
		User:    specs.User{UID: spec.uid, GID: spec.gid},
		Args:    spec.argv,
		Env:     spec.env,
		Cwd:     spec.cwd,
		Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1048576, Soft: 1048576}},
	}
	if spec.uid == 0 {
		proc.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	} else {
		proc.Capabilities = &specs.LinuxCapabilities{Bounding: caps}
	}
	// The tmpfs on /tmp (from KernelMounts) hides whatever a build would
	// leave there, as sandboxes will see it; runsc would otherwise mount
	// one only where /tmp is empty.
	mounts := gvisor.KernelMounts()
	for i, m := range spec.mounts {
		mounts = append(mounts, specs.Mount{
			Destination: fmt.Sprintf("/%s/src%d", mountDir, i), Type: "bind", Source: m,
			Options: []string{"rbind", "ro"},
		})
	}
	s := specs.Spec{
		Version:  specs.Version,
		Process:  proc,
		Root:     &specs.Root{Path: rootfs},
		Hostname: "build",
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace},
			},
		},
	}
	b, err := json.MarshalIndent(&s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600)
}
