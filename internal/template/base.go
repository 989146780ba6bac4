package template

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BasePackages are installed into the base template on top of Debian's
// minimal base: what E2B users' code expects to find.
var BasePackages = []string{
	"bash", "coreutils", "python3", "ca-certificates", "procps", "iproute2",
	"curl", "less", "sudo",
}

// CodeInterpreterID is the template the code-interpreter SDK starts by
// default; CodeInterpreterAlias is its short name.
const (
	CodeInterpreterID    = "code-interpreter-v1"
	CodeInterpreterAlias = "code-interpreter"
)

// CodeInterpreterPackages are added to BasePackages for the code-interpreter
// template: a Jupyter kernel and the data stack agents' code imports, all
// from Debian (no PyPI on these hosts).
var CodeInterpreterPackages = []string{
	"python3-ipykernel", "python3-numpy", "python3-pandas", "python3-matplotlib",
	"python3-scipy", "python3-requests", "python3-pil",
}

// CodeInterpreterTool is the node binary that serves the code
// interpreter; CodeInterpreterPort is where the SDK expects it.
const (
	CodeInterpreterTool = "interpreter"
	CodeInterpreterPort = 49999
)

// CodeInterpreter describes the code-interpreter template over the tree
// BuildCodeInterpreter made at root. Its service starts in a sandbox
// snapshotted once the service answers, so every sandbox of it starts
// with a Python kernel already running.
func CodeInterpreter(root string) (*Template, error) {
	fi, err := os.Stat(filepath.Join(root, "usr/lib/python3/dist-packages/ipykernel"))
	if err != nil {
		return nil, fmt.Errorf("code-interpreter template at %s (build it with aenv template build-code-interpreter): %w", root, err)
	}
	size, _ := diskUsage(root)
	return &Template{
		ID: CodeInterpreterID, Aliases: []string{CodeInterpreterAlias}, CPUCount: 2, MemoryMB: 1024,
		CreatedAt: fi.ModTime().UTC(), SizeBytes: size, RootFS: root,
		StartCmd: "/.aenv/" + CodeInterpreterTool,
		ReadyCmd: fmt.Sprintf("curl -sf -o /dev/null http://127.0.0.1:%d/health", CodeInterpreterPort),
		Tools:    []string{CodeInterpreterTool},
	}, nil
}

// BuildOptions configures BuildBase and BuildCodeInterpreter.
type BuildOptions struct {
	// Mirror is the Debian mirror; empty means the first one in this host's
	// apt sources.
	Mirror string
	// Suite is the Debian release; empty means bookworm.
	Suite string
	// Log receives debootstrap's progress.
	Log io.Writer
}

// BuildBase builds the base root filesystem at dest with debootstrap, from
// Debian's packages only (no container registry needed), and adds the
// unprivileged `user` that E2B commands run as by default. It builds into a
// temporary sibling and renames, so an interrupted build never leaves a
// half tree at dest.
func BuildBase(ctx context.Context, dest string, opts BuildOptions) error {
	if err := buildDebian(ctx, dest, BasePackages, nil, opts); err != nil {
		return fmt.Errorf("building base template: %w", err)
	}
	return nil
}

// BuildCodeInterpreter builds the code-interpreter template's root
// filesystem at dest: base plus CodeInterpreterPackages. Its service (the
// aenv-interpreter binary) is not in the tree: sandboxes get the node's own
// copy, like envd, so a cached tree never runs an old service.
func BuildCodeInterpreter(ctx context.Context, dest string, opts BuildOptions) error {
	if err := buildDebian(ctx, dest, BasePackages, CodeInterpreterPackages, opts); err != nil {
		return fmt.Errorf("building code-interpreter template: %w", err)
	}
	return nil
}

// buildDebian debootstraps packages into dest, installs extra with apt
// inside it and adds `user`. Large package sets go through apt, not
// debootstrap's --include: debootstrap configures them in an order that
// fails for Python extension packages (python3-zmq).
func buildDebian(ctx context.Context, dest string, packages, extra []string, opts BuildOptions) error {
	if opts.Suite == "" {
		opts.Suite = "bookworm"
	}
	if opts.Mirror == "" {
		m, err := aptMirror()
		if err != nil {
			return err
		}
		opts.Mirror = m
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return fmt.Errorf("debootstrap not installed (apt-get install debootstrap): %w", err)
	}
	tmp := dest + ".building"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return err
	}
	run := func(name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stdout, cmd.Stderr = opts.Log, opts.Log
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("running %s: %w", name, err)
		}
		return nil
	}
	if err := run("debootstrap", "--variant=minbase", "--include="+strings.Join(packages, ","),
		opts.Suite, tmp, opts.Mirror); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	var steps [][]string
	if len(extra) > 0 {
		// apt inside the tree resolves the mirror with this host's DNS.
		if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
			os.WriteFile(filepath.Join(tmp, "etc/resolv.conf"), b, 0o644)
		}
		steps = append(steps, []string{"chroot", tmp, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q",
			"--no-install-recommends"})
		steps[0] = append(steps[0], extra...)
	}
	steps = append(steps, [][]string{
		{"chroot", tmp, "useradd", "--create-home", "--shell", "/bin/bash", "--uid", "1000", "user"},
		{"chroot", tmp, "sh", "-c", "echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/user && chmod 0440 /etc/sudoers.d/user"},
		{"chroot", tmp, "apt-get", "clean"},
	}...)
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			os.RemoveAll(tmp)
			return err
		}
	}
	if err := quickProfile(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	os.RemoveAll(filepath.Join(tmp, "var/lib/apt/lists"))
	if err := os.RemoveAll(dest); err != nil {
		return err
	}
	if err := os.Rename(tmp, dest); err != nil {
		return err
	}
	return nil
}

// profileUID is how Debian's /etc/profile asks for the user's id, and
// profileQuickUID the same from bash's own EUID, with id(1) left for the
// shells without it (dash).
const (
	profileUID      = `"$(id -u)"`
	profileQuickUID = `"${EUID:-$(id -u)}"`
)

// quickProfile makes root's /etc/profile ask bash for the user's id rather
// than run id(1). Every command the SDKs run is a login shell (`bash -l
// -c`), which reads /etc/profile: Debian's forks and execs `id` for it,
// which under gVisor was half of a command's round trip
// (BenchmarkRoundTrip in internal/server: 48.6 ms, 22.7 ms without).
func quickProfile(root string) error {
	p := filepath.Join(root, "etc/profile")
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the tree's /etc/profile: %w", err)
	}
	if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(b), profileUID, profileQuickUID)), 0o644); err != nil {
		return fmt.Errorf("writing the tree's /etc/profile: %w", err)
	}
	return nil
}

// aptMirror reads the first Debian mirror from this host's apt sources, so
// that the base template comes from wherever this host gets its packages.
func aptMirror() (string, error) {
	files := []string{"/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			switch {
			case len(fields) >= 2 && fields[0] == "URIs:":
				fh.Close()
				return fields[1], nil
			case len(fields) >= 3 && fields[0] == "deb":
				uri := fields[1]
				if strings.HasPrefix(uri, "[") { // deb [options] uri suite
					for i := 1; i < len(fields); i++ {
						if strings.HasSuffix(fields[i], "]") && i+1 < len(fields) {
							uri = fields[i+1]
							break
						}
					}
				}
				if !strings.Contains(uri, "security") {
					fh.Close()
					return uri, nil
				}
			}
		}
		fh.Close()
	}
	return "", fmt.Errorf("no Debian mirror found in apt sources; pass one explicitly")
}
