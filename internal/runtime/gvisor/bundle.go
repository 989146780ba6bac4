package gvisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/runtime/cgroups"
)

// EnvdGuestPath is where the envd binary appears inside every sandbox.
const EnvdGuestPath = runtime.ToolsDir + "/envd"

// cpuPeriod is the CFS period used to express CPU counts as a quota, in
// microseconds.
const cpuPeriod = 100000

// caps is the capability set of the sandbox's root: what envd needs to
// switch users and manage files, and what a root shell in a container
// usually has. gVisor enforces them against its own kernel, not the host's.
var caps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	"CAP_SYS_PTRACE",
}

// writeBundle writes the OCI bundle of spec into dir: config.json plus the
// per-sandbox files bound into the guest. The sandbox's cgroup is
// cgroupPath. With toolsImage set the sandbox runs without a gofer (see
// withoutGofer), with /.aenv from that image, and binds no files: the
// root image's identity is recorded instead (noteRootImage).
func writeBundle(dir string, spec runtime.Spec, cgroupPath, toolsImage string) error {
	s := OCISpec(dir, spec, cgroupPath)
	if toolsImage == "" {
		if err := WriteBundleFiles(dir, spec); err != nil {
			return err
		}
	} else {
		withoutGofer(s, spec, toolsImage)
		if err := noteRootImage(dir, spec, toolsImage); err != nil {
			return err
		}
	}
	if spec.Prestarted {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[PrestartedAnnotation] = "true"
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}

// PrestartedAnnotation marks the spec of a sandbox booted for the warm
// pool (runtime.Spec.Prestarted). aenv's runsc build (scripts/runsc-main)
// reads it as its sentry starts: such a sentry keeps the heap its boot
// freed until it is first used (keepUntilUsed there), where any other
// returns it to the host at its first 30 s tick: a pooled sandbox's
// first command after its handout faulted that heap back in. Its name is
// outside gVisor's dev.gvisor. prefix, which a restore compares with the
// checkpoint's: a pooled sandbox's snapshot restores without it.
const PrestartedAnnotation = "dev.aenv.prestarted"

// WriteBundleFiles writes the per-sandbox files OCISpec binds into the
// guest (resolv.conf, hosts) into dir.
func WriteBundleFiles(dir string, spec runtime.Spec) error {
	hosts, resolv := bundleFiles(spec)
	for name, content := range map[string]string{"resolv.conf": resolv, "hosts": hosts} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// bundleFiles are the contents of spec's /etc/hosts and /etc/resolv.conf.
func bundleFiles(spec runtime.Spec) (hosts, resolv string) {
	var b strings.Builder
	for _, s := range spec.DNSServers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	return fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", hostname(spec)), b.String()
}

func hostname(spec runtime.Spec) string {
	if spec.Hostname != "" {
		return spec.Hostname
	}
	return spec.ID
}

// OCISpec is the OCI spec the driver runs spec with: envd as the first
// process (when spec.EnvdPath is set), the mounts, capabilities, rlimits,
// namespaces (a new network namespace when spec.NetNSPath is empty) and
// cgroup limits. It is exported so that the benchmark's bare-runsc
// baseline starts sandboxes of exactly the same shape. dir holds the files
// WriteBundleFiles writes.
func OCISpec(dir string, spec runtime.Spec, cgroupPath string) *specs.Spec {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if spec.EnvdAccessToken != "" {
		env = append(env, "AENV_ENVD_ACCESS_TOKEN="+spec.EnvdAccessToken)
	}
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: []string{EnvdGuestPath, "--port", strconv.Itoa(spec.EnvdPort)},
			Env:  env,
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1048576, Soft: 1048576}},
		},
		Root:     &specs.Root{Path: spec.Root.Dir, Readonly: false},
		Hostname: hostname(spec),
		Mounts: append(KernelMounts(),
			specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: filepath.Join(dir, "resolv.conf"), Options: []string{"rbind", "ro"}},
			specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: filepath.Join(dir, "hosts"), Options: []string{"rbind", "ro"}},
		),
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: spec.NetNSPath},
			},
			CgroupsPath: cgroupPath,
			Resources:   resources(spec),
		},
	}
	if spec.PidsLimit > 0 {
		// gVisor enforces RLIMIT_NPROC in its own kernel: a fork bomb
		// fails inside the sandbox instead of reaching the host.
		n := guestNproc(spec.PidsLimit)
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: n, Soft: n})
	}
	if spec.EnvdPath != "" {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: EnvdGuestPath, Type: "bind", Source: spec.EnvdPath, Options: []string{"rbind", "ro"}})
	}
	for _, b := range spec.Binds {
		mode := "ro"
		if b.Writable {
			mode = "rw"
		}
		s.Mounts = append(s.Mounts, specs.Mount{Destination: b.Destination, Type: "bind", Source: b.Source, Options: []string{"rbind", mode}})
	}
	return s
}

// KernelMounts are the pseudo and scratch filesystems every sandbox gets:
// /proc, /dev (with pts and shm), a read-only /sys and a fresh tmpfs on
// /tmp. Other runsc users in aenv (template builds) start from these too.
func KernelMounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
	}
}

// resources are the host cgroup limits of spec, as the OCI spec gives
// them to runsc for the cgroup it makes.
func resources(spec runtime.Spec) *specs.LinuxResources {
	lim := hostLimits(spec.MemoryMB, spec.CPUCount, spec.PidsLimit)
	r := &specs.LinuxResources{}
	if lim.MemoryBytes > 0 {
		r.Memory = &specs.LinuxMemory{Limit: &lim.MemoryBytes}
	}
	if lim.CPUQuota > 0 {
		quota := lim.CPUQuota.Microseconds()
		period := uint64(lim.CPUPeriod.Microseconds())
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if lim.Pids > 0 {
		r.Pids = &specs.LinuxPids{Limit: &lim.Pids}
	}
	if spec.Prestarted {
		// The lowest weight until the handout (Driver.Foreground).
		shares := uint64(backgroundShares)
		if r.CPU == nil {
			r.CPU = &specs.LinuxCPU{}
		}
		r.CPU.Shares = &shares
	}
	return r
}

// backgroundShares is the CPU weight a prestarted sandbox's cgroup is
// made with: cgroup v1's lowest cpu.shares, as the OCI spec gives it
// (runsc turns it into v2's lowest cpu.weight, 1).
const backgroundShares = 2

// hostLimits are the host cgroup limits of a sandbox or step of the
// given memory, CPUs and pids limit; zero fields are unlimited.
func hostLimits(memoryMB, cpuCount, pidsLimit int) cgroups.Limits {
	var lim cgroups.Limits
	if memoryMB > 0 {
		lim.MemoryBytes = int64(memoryMB) << 20
	}
	if cpuCount > 0 {
		lim.CPUQuota = time.Duration(cpuCount) * cpuPeriod * time.Microsecond
		lim.CPUPeriod = cpuPeriod * time.Microsecond
	}
	if pidsLimit > 0 {
		lim.Pids = hostPidsBackstop(pidsLimit)
	}
	return lim
}

// HostPidsOverhead is what a sandbox's pids cgroup allows past its pids
// limit: the host threads of runsc itself (about 20 of the sentry's, 7 of
// the gofer's, measured under a fork bomb) and of the address spaces of
// root's few processes (envd, the commands it runs).
const HostPidsOverhead = 75

// hostPidsBackstop is the host pids cgroup limit of a sandbox whose pids
// limit is limit: the limit bounds the sandbox's host tasks, not only its
// guest ones. The guest's own limit (guestNproc) keeps a fork bomb below
// it, since the sandbox dies when gVisor cannot make a host task (the
// cgroup's limit is for a root inside spreading its tasks over many uids,
// each with its own RLIMIT_NPROC).
func hostPidsBackstop(limit int) int64 { return int64(limit + HostPidsOverhead) }

// guestNproc is each guest user's RLIMIT_NPROC for a pids limit: two
// fifths of it, because gVisor's systrap platform runs two host processes
// for every guest address space (a stub and a sysmsg thread of it), keeps
// them pooled after the guest process is gone, and releases them to the
// pool a while after it is: a fork bomb of 128 guest tasks held 193 to
// 294 of them. A fork bomb then fails with EAGAIN inside, within the host
// bound, and the sandbox lives on.
func guestNproc(limit int) uint64 { return uint64(max(limit*2/5, 1)) }

// Annotations by which runsc mounts a sandbox's root from an image file
// in the sandbox process itself, instead of serving a directory through
// a gofer process (runsc's mount hints).
const (
	rootfsSourceAnnotation  = "dev.gvisor.spec.rootfs.source"
	rootfsTypeAnnotation    = "dev.gvisor.spec.rootfs.type"
	rootfsOverlayAnnotation = "dev.gvisor.spec.rootfs.overlay"
	rootfsOptionsAnnotation = "dev.gvisor.spec.rootfs.options"
)

// Environment variables by which envd learns the contents of /etc/hosts
// and /etc/resolv.conf when they cannot be bound in (envd.HostsEnv and
// envd.ResolvConfEnv: spelled out here so that the driver does not link
// envd's server).
const (
	hostsEnv      = "AENV_ETC_HOSTS"
	resolvConfEnv = "AENV_ETC_RESOLV_CONF"
)

// withoutGofer turns s, spec's OCI spec, into one that runsc runs without
// a gofer process: the root is spec.Root.Image (EROFS), mounted by the
// sentry, its writes in a file in the sandbox's directory as before
// (--overlay2's; our runsc build's patch, scripts/runsc-patch.sh, puts it
// there); /.aenv is toolsImage, an EROFS image of envd and the node
// binaries bound in; /etc/hosts and /etc/resolv.conf, which only a gofer
// could bind, are written by envd as it starts. A gofer costs every idle
// sandbox ~3.3 MiB of host memory and each start a process (measured:
// ARCHITECTURE, "An idle sandbox").
//
// The overlay annotation names the medium only: runsc takes the
// filestore's directory from --overlay2, which differs per sandbox,
// whereas annotations must not differ between a checkpoint and its
// restores.
func withoutGofer(s *specs.Spec, spec runtime.Spec, toolsImage string) {
	mounts := KernelMounts()
	mounts = append(mounts, specs.Mount{Destination: path.Dir(EnvdGuestPath), Type: "erofs", Source: toolsImage, Options: []string{"ro"}})
	s.Mounts = mounts
	overlay := "memory"
	if spec.DiskMB > 0 {
		overlay = "dir=/"
	}
	s.Annotations = map[string]string{
		rootfsSourceAnnotation:  spec.Root.Image,
		rootfsTypeAnnotation:    "erofs",
		rootfsOverlayAnnotation: overlay,
	}
	if spec.DiskMB > 0 {
		s.Annotations[rootfsOptionsAnnotation] = fmt.Sprintf("size=%dm", spec.DiskMB)
	}
	hosts, resolv := bundleFiles(spec)
	s.Process.Env = append(s.Process.Env, hostsEnv+"="+hosts, resolvConfEnv+"="+resolv)
}
