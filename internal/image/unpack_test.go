package image

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/aenvhq/aenv/internal/testutil"
)

func TestCleanPath(t *testing.T) {
	good := map[string]string{
		"a/b":      "a/b",
		"./a/b/":   "a/b",
		"/a//b":    "a/b",
		"./":       "",
		"/":        "",
		"a/./b":    "a/b",
		"..a/b..":  "..a/b..",
		".wh.file": ".wh.file",
	}
	for in, want := range good {
		if got, err := cleanPath(in); err != nil || got != want {
			t.Errorf("cleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"..", "../a", "a/../../b", "a/..", "/../a", "a\x00b"} {
		if got, err := cleanPath(bad); err == nil {
			t.Errorf("cleanPath(%q) = %q, want an error", bad, got)
		}
	}
}

func TestSplitPathRef(t *testing.T) {
	dir := t.TempDir()
	withColon := filepath.Join(dir, "a:b")
	if err := os.Mkdir(withColon, 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ in, path, ref string }{
		{dir, dir, ""},
		{dir + ":v1", dir, "v1"},
		{dir + ":example.com/img:v1", dir, "example.com/img:v1"},
		{withColon, withColon, ""},
		{withColon + ":tag", withColon, "tag"},
		{"/missing/x:tag", "/missing/x", "tag"},
		{"/missing/x", "/missing/x", ""},
	}
	for _, c := range cases {
		if p, r := splitPathRef(c.in); p != c.path || r != c.ref {
			t.Errorf("splitPathRef(%q) = %q, %q; want %q, %q", c.in, p, r, c.path, c.ref)
		}
	}
}

func TestAccountFiles(t *testing.T) {
	f := []byte("root:x:0:0::/root:/bin/sh\nusers:x:100:\n")
	if !hasEntry(f, "root") || hasEntry(f, "user") || !hasEntry(f, "users") {
		t.Fatal("hasEntry matched wrongly")
	}
	if got := string(appendLine([]byte("a"), "b")); got != "a\nb\n" {
		t.Fatalf("appendLine = %q", got)
	}
	if got := string(appendLine(nil, "b")); got != "b\n" {
		t.Fatalf("appendLine = %q", got)
	}
}

// TestMakeUsable checks the accounts added to a tree: an image's own
// `user` is left alone, bash is preferred as the login shell, and account
// files are edited inside the tree even when they are links.
func TestMakeUsable(t *testing.T) {
	testutil.RequireRoot(t)
	t.Run("image has user", func(t *testing.T) {
		dir := t.TempDir()
		writeTree(t, dir, map[string]string{
			"bin/bash":    "#!",
			"etc/passwd":  "root:x:0:0::/root:/bin/bash\nuser:x:1001:1001::/srv:/bin/bash\n",
			"etc/group":   "root:x:0:\n",
			"etc/shadow":  "root:*:::::::\n",
			"etc/skel/.x": "x",
		})
		mustUsable(t, dir)
		assertFile(t, dir, "etc/passwd", "root:x:0:0::/root:/bin/bash\nuser:x:1001:1001::/srv:/bin/bash\n")
		assertFile(t, dir, "etc/group", "root:x:0:\n")
		if _, err := os.Stat(filepath.Join(dir, "home")); !os.IsNotExist(err) {
			t.Fatalf("home made for an image's own user: %v", err)
		}
	})
	t.Run("debian-like", func(t *testing.T) {
		dir := t.TempDir()
		writeTree(t, dir, map[string]string{
			"bin/bash":             "#!",
			"bin/sh":               "#!",
			"etc/passwd":           "root:x:0:0:root:/root:/bin/bash\nubuntu:x:1000:1000::/home/ubuntu:/bin/bash",
			"etc/group":            "root:x:0:\nubuntu:x:1000:\n",
			"etc/shadow":           "root:*:19000:0:99999:7:::\n",
			"etc/skel/.bashrc":     "# rc\n",
			"etc/sudoers.d/README": "",
		})
		mustUsable(t, dir)
		assertFile(t, dir, "etc/passwd", "root:x:0:0:root:/root:/bin/bash\nubuntu:x:1000:1000::/home/ubuntu:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n")
		assertFile(t, dir, "etc/group", "root:x:0:\nubuntu:x:1000:\nuser:x:1000:\n")
		assertFile(t, dir, "etc/shadow", "root:*:19000:0:99999:7:::\nuser:!::0:99999:7:::\n")
		assertFile(t, dir, "home/user/.bashrc", "# rc\n")
		assertFile(t, dir, "etc/sudoers.d/user", "user ALL=(ALL:ALL) NOPASSWD: ALL\n")
		for _, p := range []string{"home/user", "home/user/.bashrc"} {
			st, err := os.Stat(filepath.Join(dir, p))
			if err != nil {
				t.Fatal(err)
			}
			if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 1000 || sys.Gid != 1000 {
				t.Errorf("%s owned by %d:%d, want 1000:1000", p, sys.Uid, sys.Gid)
			}
		}
	})
	t.Run("passwd through a link out of the tree", func(t *testing.T) {
		dir := t.TempDir()
		outside := filepath.Join(t.TempDir(), "passwd")
		if err := os.WriteFile(outside, []byte("host:x:0:0::/:/bin/sh\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		// The same path inside the tree, where the link really leads.
		inside := strings.TrimPrefix(outside, "/")
		writeTree(t, dir, map[string]string{"bin/sh": "#!", inside: "img:x:5:5::/:/bin/sh\n"})
		if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(dir, "etc/passwd")); err != nil {
			t.Fatal(err)
		}
		mustUsable(t, dir)
		b, _ := os.ReadFile(outside)
		if string(b) != "host:x:0:0::/:/bin/sh\n" {
			t.Fatalf("a file outside the tree was changed: %q", b)
		}
		assertFile(t, dir, inside, "img:x:5:5::/:/bin/sh\nroot:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n")
	})
}

func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(p, "bin/") {
			mode = 0o755
		}
		if err := os.WriteFile(full, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
}

func mustUsable(t *testing.T, dir string) {
	t.Helper()
	r, err := openRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	if err := makeUsable(r); err != nil {
		t.Fatal(err)
	}
}

func assertFile(t *testing.T, dir, rel, want string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, rel))
	if err != nil || string(b) != want {
		t.Errorf("%s = %q, %v; want %q", rel, b, err, want)
	}
}
