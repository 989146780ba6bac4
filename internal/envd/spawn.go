package envd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// spawnSpec describes a process to start.
type spawnSpec struct {
	argv []string // argv[0] is the command as requested
	env  []string
	dir  string
	user *sysUser
	// switchUser sets the child's credentials to user's; only root can.
	switchUser bool
	pty        *ptySize // nil: plain pipes
	stdin      bool     // keep a stdin pipe open (ignored with a pty)
	// script gives the child a pipe on descriptor 3 (ignored with a pty):
	// a ready shell reads its command from it (see readyShells).
	script bool
}

type ptySize struct{ cols, rows uint16 }

// child is a started process and the parent's ends of its stdio.
type child struct {
	pid     int
	status  <-chan syscall.WaitStatus
	stdin   *os.File // stdin pipe, nil when stdin was not requested
	script  *os.File // descriptor 3's pipe, nil unless spec.script
	pty     *os.File // pty master, nil without a pty
	outputs []output
}

type output struct {
	kind outputKind
	f    *os.File
}

// lookPath finds the executable for name like a shell would, using the
// PATH the child will get rather than envd's own.
func lookPath(name string, env []string, dir string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("resolving command: %w: empty command", errInvalid)
	}
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := executable(p); err != nil {
			return "", fmt.Errorf("resolving command %s: %w: %v", name, errInvalid, err)
		}
		return p, nil
	}
	pathVar := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
		}
	}
	for _, d := range filepath.SplitList(pathVar) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("resolving command %s: %w: not found in PATH", name, errInvalid)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}
