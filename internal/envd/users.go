package envd

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// sysUser is a user processes and file operations run as.
type sysUser struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, primary group included
	Home   string
	Shell  string
}

var rootUser = sysUser{Name: "root", Home: "/root", Shell: "/bin/sh", Groups: []uint32{0}}

type passwdEntry struct {
	name       string
	uid, gid   uint32
	home       string
	shellPath  string
	groupNames []string
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// userDB is a parsed copy of the sandbox's passwd and group files. envd
// parses them itself instead of using os/user so that it behaves the same
// with and without cgo and can be pointed at test files.
type userDB struct {
	users  []passwdEntry
	groups []groupEntry
}

// loadUserDB reads etc/passwd and etc/group; missing files read as empty.
func loadUserDB(etc string) (*userDB, error) {
	db := &userDB{}
	err := readColonFile(filepath.Join(etc, "passwd"), func(f []string) {
		if len(f) < 7 {
			return
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return
		}
		db.users = append(db.users, passwdEntry{name: f[0], uid: uint32(uid), gid: uint32(gid), home: f[5], shellPath: f[6]})
	})
	if err != nil {
		return nil, err
	}
	err = readColonFile(filepath.Join(etc, "group"), func(f []string) {
		if len(f) < 4 {
			return
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return
		}
		var members []string
		if f[3] != "" {
			members = strings.Split(f[3], ",")
		}
		db.groups = append(db.groups, groupEntry{name: f[0], gid: uint32(gid), members: members})
	})
	if err != nil {
		return nil, err
	}
	return db, nil
}

// userDBCache keeps the parsed passwd and group files while neither has
// changed. Every command resolves its user, and reading the two files
// takes ~18 system calls (os.File's open, poller checks, reads, close),
// each ~40 µs of host CPU under gVisor here; a stat of each takes 2.
type userDBCache struct {
	mu    sync.Mutex
	etc   string
	stamp [2]fileStamp
	db    *userDB
}

// fileStamp tells one version of a file from another: an edit in place
// changes its times (kept to the nanosecond), a replacement its inode.
type fileStamp struct {
	ok           bool // the stat succeeded; without it nothing is cached
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

func stampOf(path string) fileStamp {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileStamp{}
	}
	return fileStamp{ok: true, dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// load returns the user database, read again when either file changed
// since the last read (or could not be stat'ed: a missing file is read
// as empty each time). A change between the stat and the read leaves
// newer contents under the older stamp, which the next stat misses, so
// they are read again then.
func (c *userDBCache) load() (*userDB, error) {
	stamp := [2]fileStamp{stampOf(filepath.Join(c.etc, "passwd")), stampOf(filepath.Join(c.etc, "group"))}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.db != nil && stamp[0].ok && stamp[1].ok && stamp == c.stamp {
		return c.db, nil
	}
	db, err := loadUserDB(c.etc)
	if err != nil {
		return nil, err
	}
	c.stamp, c.db = stamp, db
	return db, nil
}

func readColonFile(path string, fn func([]string)) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '+' || line[0] == '-' {
			continue
		}
		fn(strings.Split(line, ":"))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	return nil
}

// user returns the named user with its supplementary groups.
func (db *userDB) user(name string) (*sysUser, bool) {
	for _, e := range db.users {
		if e.name != name {
			continue
		}
		u := &sysUser{Name: e.name, UID: e.uid, GID: e.gid, Home: e.home, Shell: e.shellPath, Groups: []uint32{e.gid}}
		for _, g := range db.groups {
			if slices.Contains(g.members, name) && !slices.Contains(u.Groups, g.gid) {
				u.Groups = append(u.Groups, g.gid)
			}
		}
		if u.Shell == "" {
			u.Shell = "/bin/sh"
		}
		return u, true
	}
	return nil, false
}

// userName returns the name of uid, or the number when it has none.
func (db *userDB) userName(uid uint32) string {
	for _, e := range db.users {
		if e.uid == uid {
			return e.name
		}
	}
	return strconv.FormatUint(uint64(uid), 10)
}

// groupName returns the name of gid, or the number when it has none.
func (db *userDB) groupName(gid uint32) string {
	for _, g := range db.groups {
		if g.gid == gid {
			return g.name
		}
	}
	return strconv.FormatUint(uint64(gid), 10)
}

// resolveUser returns the user a request runs as: the named one, or the
// default user when name is empty. A default user that does not exist falls
// back to root, so that images without the conventional "user" still work.
func (s *Server) resolveUser(name string) (*sysUser, error) {
	u, _, err := s.resolveUserIn(name)
	return u, err
}

// resolveUserIn is resolveUser that also returns the user database it
// looked in, for callers that name owners with it too.
func (s *Server) resolveUserIn(name string) (*sysUser, *userDB, error) {
	explicit := name != ""
	if !explicit {
		name = s.cfg.user()
	}
	db, err := s.users.load()
	if err != nil {
		return nil, nil, fmt.Errorf("looking up user %q: %w", name, err)
	}
	if u, ok := db.user(name); ok {
		return u, db, nil
	}
	if name == "root" || !explicit {
		if !explicit && s.warnedUser.Swap(true) == false {
			s.log.Warn("default user does not exist, using root", "user", name)
		}
		u := rootUser
		u.Groups = slices.Clone(rootUser.Groups)
		return &u, db, nil
	}
	return nil, nil, fmt.Errorf("looking up user %q: %w", name, errUnknownUser)
}

// basicAuthUser extracts the user name from `Authorization: Basic
// base64("<user>:")`, the way E2B clients choose the user. It returns ""
// when the header is absent.
func basicAuthUser(h http.Header) (string, error) {
	v := h.Get("Authorization")
	if v == "" {
		return "", nil
	}
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", fmt.Errorf("parsing Authorization header: %w: not Basic", errInvalid)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", fmt.Errorf("parsing Authorization header: %w: %v", errInvalid, err)
	}
	name, _, _ := strings.Cut(string(raw), ":")
	return name, nil
}

// userFromHeader resolves the user an RPC runs as.
func (s *Server) userFromHeader(h http.Header) (*sysUser, error) {
	name, err := basicAuthUser(h)
	if err != nil {
		return nil, err
	}
	return s.resolveUser(name)
}
