package envd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteEtcFiles: the files the environment carries replace what was
// in etc (a dangling link included), the variables leave the
// environment, and the hosts file is reported for the follower.
func TestWriteEtcFiles(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../run/resolver/resolv.conf", filepath.Join(root, "etc", "resolv.conf")); err != nil {
		t.Fatal(err)
	}
	t.Setenv(HostsEnv, "127.0.1.1\tsbx\n")
	t.Setenv(ResolvConfEnv, "nameserver 10.0.0.1\n")
	hosts, err := WriteEtcFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	if hosts != filepath.Join(root, "etc", "hosts") {
		t.Errorf("hosts file %q, want etc/hosts", hosts)
	}
	for name, want := range map[string]string{"hosts": "127.0.1.1\tsbx\n", "resolv.conf": "nameserver 10.0.0.1\n"} {
		b, err := os.ReadFile(filepath.Join(root, "etc", name))
		if err != nil || string(b) != want {
			t.Errorf("etc/%s = %q (%v), want %q", name, b, err, want)
		}
	}
	for _, env := range []string{HostsEnv, ResolvConfEnv} {
		if _, ok := os.LookupEnv(env); ok {
			t.Errorf("%s is still in the environment", env)
		}
	}
	if hosts, err := WriteEtcFiles(root); err != nil || hosts != "" {
		t.Errorf("without the variables: hosts %q, err %v; want neither", hosts, err)
	}
}

// TestHostsFollowerRenames: once the host name is not the one the file
// was written for, sync rewrites the host's own line, and only it.
func TestHostsFollowerRenames(t *testing.T) {
	name, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(file, []byte("127.0.0.1\tlocalhost\n127.0.1.1\tsaved-name\n10.0.0.9\tdb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHostsFollower(file)
	h.name = "saved-name" // what a restore under another name leaves
	if err := h.sync(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(file)
	if want := "127.0.0.1\tlocalhost\n127.0.1.1\t" + name + "\n10.0.0.9\tdb\n"; string(b) != want {
		t.Errorf("hosts after the rename:\n%s\nwant:\n%s", b, want)
	}
	// Unchanged since: not rewritten.
	if err := os.WriteFile(file, []byte("edited by the user\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.sync(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); !strings.HasPrefix(string(b), "edited") {
		t.Errorf("sync rewrote a file whose host name had not changed: %q", b)
	}
	var none *hostsFollower
	if err := none.sync(); err != nil {
		t.Errorf("a nil follower: %v", err)
	}
}
