package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/aenvhq/aenv/internal/runtime"
)

var _ runtime.Stepper = (*Driver)(nil)

// stepCaps is what a step running as root may do, as in a container build.
var stepCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// stepsRoot is runsc's --root for build steps: they run with other global
// flags than sandboxes (no network, writes straight into the tree), so
// they get a root of their own.
func (d *Driver) stepsRoot() string { return filepath.Join(d.cfg.StateDir, "steps") }

// stepArgs are runsc's global flags for build steps: network through the
// step's own namespace when it has one (never the host's), none
// otherwise.
func (d *Driver) stepArgs(network bool, args ...string) []string {
	mode := "--network=none"
	if network {
		mode = "--network=sandbox"
	}
	flags := append([]string{
		"--root", d.stepsRoot(),
		"--platform=" + d.cfg.Platform,
		mode,
		// Writes land in the tree being built.
		"--overlay2=none",
		// nproc inside is the step's CPU quota, as in sandboxes.
		"--cpu-num-from-quota",
	}, d.fastPathFlags...)
	return append(flags, args...)
}

// RunStep implements runtime.Stepper: one runsc sandbox per step, run in
// the foreground (runsc run) so that its output and exit code are the
// command's. Its resources are bounded as a sandbox's are, by host cgroups
// under the driver's CgroupParent (so PidsTotal covers steps too).
func (d *Driver) RunStep(ctx context.Context, spec runtime.StepSpec, out io.Writer) (code int, err error) {
	var b [8]byte
	rand.Read(b[:])
	id := "step-" + hex.EncodeToString(b[:])
	bundle := filepath.Join(d.cfg.StateDir, "steps-bundles", id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return -1, fmt.Errorf("running build step: %w", err)
	}
	defer os.RemoveAll(bundle)
	// The step's cgroup is made before runsc runs: runsc joins a cgroup
	// that exists and leaves it in place when the step ends (one it makes
	// it removes, with its OOM count), so that the count can still be
	// read. runsc sets no limits on a cgroup it did not make, so it gets
	// them all here.
	cgroup := d.cgroup(id)
	if err := d.cg.Create(cgroup, hostLimits(spec.MemoryMB, spec.CPUCount, spec.PidsLimit)); err != nil {
		if rmErr := d.cg.Remove(cgroup); rmErr != nil {
			d.log.Warn("removing a build step's cgroup", "cgroup", cgroup, "err", rmErr)
		}
		return -1, fmt.Errorf("running build step: %w", err)
	}
	defer func() {
		if n, _ := d.cg.OOMKills(cgroup); n > 0 && err == nil {
			code, err = -1, fmt.Errorf("running build step: %w", runtime.ErrOutOfMemory)
		}
		if rmErr := d.cg.Remove(cgroup); rmErr != nil {
			d.log.Warn("removing a build step's cgroup", "cgroup", cgroup, "err", rmErr)
		}
	}()
	if err := writeStepConfig(bundle, spec, d.cg.Path(cgroup)); err != nil {
		return -1, fmt.Errorf("running build step: writing bundle: %w", err)
	}
	cmd := exec.Command(d.cfg.RunscPath, d.stepArgs(spec.NetNSPath != "", "run", "--bundle", bundle, id)...)
	cmd.Stdout, cmd.Stderr = out, out
	// A Ctrl-C meant for us must not reach the step half-way; a cancelled
	// ctx kills it below.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("running build step: starting runsc: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		d.deleteStep(id)
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			err = <-done
		}
		d.deleteStep(id)
		return -1, ctx.Err()
	}
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		d.deleteStep(id) // in case runsc itself failed half-way
		return ee.ExitCode(), nil
	}
	return -1, fmt.Errorf("running build step: %w", err)
}

// deleteStep removes a step's sandbox, running or not.
func (d *Driver) deleteStep(id string) {
	cmd := exec.Command(d.cfg.RunscPath, d.stepArgs(false, "delete", "--force", id)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		d.log.Debug("deleting build step sandbox", "id", id, "err", err, "out", string(out))
	}
}

// writeStepConfig writes the OCI config of one step, in cgroup.
func writeStepConfig(bundle string, spec runtime.StepSpec, cgroup string) error {
	proc := &specs.Process{
		User:    specs.User{UID: spec.UID, GID: spec.GID},
		Args:    spec.Argv,
		Env:     spec.Env,
		Cwd:     spec.Cwd,
		Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1048576, Soft: 1048576}},
	}
	if spec.PidsLimit > 0 {
		// As in sandboxes: fork fails inside past it; the host's pids
		// cgroup is the backstop.
		n := guestNproc(spec.PidsLimit)
		proc.Rlimits = append(proc.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: n, Soft: n})
	}
	if spec.UID == 0 {
		proc.Capabilities = &specs.LinuxCapabilities{Bounding: stepCaps, Effective: stepCaps, Permitted: stepCaps}
	} else {
		proc.Capabilities = &specs.LinuxCapabilities{Bounding: stepCaps}
	}
	// The tmpfs on /tmp (from KernelMounts) hides whatever a build would
	// leave there, as sandboxes will see it; runsc would otherwise mount
	// one only where /tmp is empty.
	mounts := KernelMounts()
	for _, b := range spec.Binds {
		mounts = append(mounts, specs.Mount{Destination: b.Destination, Type: "bind", Source: b.Source,
			Options: []string{"rbind", "ro"}})
	}
	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace}
	if spec.NetNSPath != "" {
		netns.Path = spec.NetNSPath
		// The step resolves with the node's resolvers; the tree's own
		// resolv.conf (what sandboxes of it get is theirs) stays as built.
		var resolv strings.Builder
		for _, s := range spec.DNSServers {
			fmt.Fprintf(&resolv, "nameserver %s\n", s)
		}
		p := filepath.Join(bundle, "resolv.conf")
		if err := os.WriteFile(p, []byte(resolv.String()), 0o644); err != nil {
			return err
		}
		mounts = append(mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: p, Options: []string{"rbind", "ro"}})
	}
	s := specs.Spec{
		Version:  specs.Version,
		Process:  proc,
		Root:     &specs.Root{Path: spec.RootFS},
		Hostname: "build",
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, netns,
			},
			CgroupsPath: cgroup,
			Resources:   resources(runtime.Spec{MemoryMB: spec.MemoryMB, CPUCount: spec.CPUCount, PidsLimit: spec.PidsLimit}),
		},
	}
	b, err := json.MarshalIndent(&s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600)
}
