package envd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// HostsEnv and ResolvConfEnv carry the contents of /etc/hosts and
// /etc/resolv.conf to an envd whose runtime cannot bind the files in (a
// gVisor sandbox without a gofer process).
const (
	HostsEnv      = "AENV_ETC_HOSTS"
	ResolvConfEnv = "AENV_ETC_RESOLV_CONF"
)

// WriteEtcFiles writes the files HostsEnv and ResolvConfEnv carry into
// root's etc, and takes the variables out of the environment so that
// commands do not inherit them. It returns the hosts file it wrote, if it
// did (for Options.HostsFile).
func WriteEtcFiles(root string) (hosts string, err error) {
	for env, name := range map[string]string{HostsEnv: "hosts", ResolvConfEnv: "resolv.conf"} {
		content, ok := os.LookupEnv(env)
		if !ok {
			continue
		}
		if err := os.Unsetenv(env); err != nil {
			return "", fmt.Errorf("clearing %s: %w", env, err)
		}
		dst := filepath.Join(root, "etc", name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", fmt.Errorf("writing %s: %w", dst, err)
		}
		if err := replaceFile(dst, []byte(content)); err != nil {
			return "", err
		}
		if name == "hosts" {
			hosts = dst
		}
	}
	return hosts, nil
}

// replaceFile puts content at dst in place of what was there, a symbolic
// link included (images often link resolv.conf to a resolver's file that
// does not exist in a sandbox). It writes in place rather than renaming
// a new file over dst: a rename would leave the temporary name's
// whiteout in the root's upper layer, which a files-only snapshot
// exports.
func replaceFile(dst string, content []byte) error {
	if fi, err := os.Lstat(dst); err == nil && !fi.Mode().IsRegular() {
		if err := os.Remove(dst); err != nil {
			return fmt.Errorf("writing %s: %w", dst, err)
		}
	}
	if err := os.WriteFile(dst, content, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	return nil
}

// hostsFollower keeps the host's own line of a hosts file envd wrote
// naming the sandbox's current host name: a restore under another name
// (a fork's child) changes the name under a running envd, which the
// platform's first /health after every start lets envd notice.
type hostsFollower struct {
	file string
	mu   sync.Mutex
	name string
}

func newHostsFollower(file string) *hostsFollower {
	if file == "" {
		return nil
	}
	name, _ := os.Hostname()
	return &hostsFollower{file: file, name: name}
}

// sync rewrites the file's 127.0.1.1 line if the host name changed.
func (h *hostsFollower) sync() error {
	if h == nil {
		return nil
	}
	name, err := os.Hostname()
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if name == h.name {
		return nil
	}
	b, err := os.ReadFile(h.file)
	if err != nil {
		return err
	}
	lines := strings.SplitAfter(string(b), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "127.0.1.1\t") || strings.HasPrefix(l, "127.0.1.1 ") {
			lines[i] = "127.0.1.1\t" + name + "\n"
		}
	}
	if err := replaceFile(h.file, []byte(strings.Join(lines, ""))); err != nil {
		return err
	}
	h.name = name
	return nil
}
