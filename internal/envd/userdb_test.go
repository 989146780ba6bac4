package envd

import (
	"os"
	"path/filepath"
	"testing"
)

// The cache serves the parsed files until either changes, in place or by
// a replacement, and never caches a missing file.
func TestUserDBCacheFollowsChanges(t *testing.T) {
	etc := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	home := func(db *userDB) string {
		t.Helper()
		u, ok := db.user("user")
		if !ok {
			return ""
		}
		return u.Home
	}
	c := &userDBCache{etc: etc}

	// No group file: read each time, so that its creation is seen.
	write("passwd", "user:x:1000:1000::/home/a:/bin/bash\n")
	db1, err := c.load()
	if err != nil || home(db1) != "/home/a" {
		t.Fatalf("first load: %v, home %q", err, home(db1))
	}
	if db2, _ := c.load(); db2 == db1 {
		t.Fatal("a database read without a group file was cached")
	}
	write("group", "dev:x:50:user\n")
	db3, err := c.load()
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := db3.user("user"); len(u.Groups) != 2 || u.Groups[1] != 50 {
		t.Fatalf("after the group file appeared: groups %v", u.Groups)
	}
	if db4, _ := c.load(); db4 != db3 {
		t.Fatal("unchanged files were read again")
	}

	// An edit in place, the same size.
	write("passwd", "user:x:1000:1000::/home/b:/bin/bash\n")
	db5, _ := c.load()
	if home(db5) != "/home/b" {
		t.Fatalf("after an edit in place: home %q", home(db5))
	}
	// A replacement, as useradd and sed -i make.
	tmp := filepath.Join(etc, "passwd.new")
	if err := os.WriteFile(tmp, []byte("user:x:1000:1000::/home/c:/bin/bash\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(etc, "passwd")); err != nil {
		t.Fatal(err)
	}
	if db6, _ := c.load(); home(db6) != "/home/c" {
		t.Fatalf("after a replacement: home %q", home(db6))
	}
}
