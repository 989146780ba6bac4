package build

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// account is who a step runs as.
type account struct {
	uid, gid uint32
	home     string
}

// lookupUser resolves USER's "user[:group]" (names or numbers) against the
// root filesystem's account files; empty is root.
func lookupUser(rootfs, spec string) (*account, error) {
	if spec == "" {
		return &account{home: "/root"}, nil
	}
	name, group, hasGroup := strings.Cut(spec, ":")
	a := &account{}
	passwd, err := readAccountFile(rootfs, "passwd")
	if err != nil {
		return nil, err
	}
	found := false
	for _, f := range passwd {
		if len(f) < 6 {
			continue
		}
		if f[0] == name || f[2] == name {
			uid, err1 := strconv.ParseUint(f[2], 10, 32)
			gid, err2 := strconv.ParseUint(f[3], 10, 32)
			if err1 != nil || err2 != nil {
				continue
			}
			a.uid, a.gid, a.home, found = uint32(uid), uint32(gid), f[5], true
			break
		}
	}
	if !found {
		uid, err := strconv.ParseUint(name, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: user %q not found in /etc/passwd", ErrInvalid, name)
		}
		a.uid, a.home = uint32(uid), "/"
	}
	if hasGroup {
		if gid, err := strconv.ParseUint(group, 10, 32); err == nil {
			a.gid = uint32(gid)
			return a, nil
		}
		groups, err := readAccountFile(rootfs, "group")
		if err != nil {
			return nil, err
		}
		for _, f := range groups {
			if len(f) >= 3 && f[0] == group {
				gid, err := strconv.ParseUint(f[2], 10, 32)
				if err == nil {
					a.gid = uint32(gid)
					return a, nil
				}
			}
		}
		return nil, fmt.Errorf("%w: group %q not found in /etc/group", ErrInvalid, group)
	}
	return a, nil
}

// readAccountFile reads /etc/NAME of the root filesystem as fields. The
// tree is the image's: symlinks in the way are refused rather than
// followed out of it.
func readAccountFile(rootfs, name string) ([][]string, error) {
	for _, p := range []string{"etc", "etc/" + name} {
		fi, err := os.Lstat(filepath.Join(rootfs, p))
		if os.IsNotExist(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return nil, fmt.Errorf("%w: /%s is a symlink; aenv does not follow it to look up users", ErrInvalid, p)
		}
	}
	b, err := os.ReadFile(filepath.Join(rootfs, "etc", name))
	if err != nil {
		return nil, err
	}
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		out = append(out, strings.Split(sc.Text(), ":"))
	}
	return out, nil
}
