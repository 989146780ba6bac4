package image

import (
	"bytes"
	"fmt"
)

// The account E2B commands run as by default.
const (
	userName = "user"
	userID   = 1000
	userHome = "home/user"
)

// makeUsable checks and completes an unpacked tree for aenv: it must have
// a shell, and it gets the `user` account (uid 1000, home /home/user) when
// the image has none, like the base template.
func makeUsable(r *rootFS) error {
	shell := ""
	switch {
	case r.isExecutable("bin/bash"):
		shell = "/bin/bash"
	case r.isExecutable("bin/sh"):
		shell = "/bin/sh"
	default:
		return ErrNoShell
	}
	if err := ensureUser(r, shell); err != nil {
		return fmt.Errorf("adding user %q: %w", userName, err)
	}
	return nil
}

// ensureUser adds root (when the image has no passwd file at all) and
// `user` to the account files, and gives a new `user` a home. An image
// that defines `user` itself is left as it is. uid 1000 is used even when
// another account has it (ubuntu's `ubuntu`): E2B code expects `user` to be
// 1000.
func ensureUser(r *rootFS, shell string) error {
	passwd, _, err := r.readFile("etc/passwd")
	if err != nil {
		return err
	}
	if hasEntry(passwd, userName) {
		return nil
	}
	newPasswd := passwd
	addedRoot := false
	if !hasEntry(newPasswd, "root") {
		newPasswd = appendLine(newPasswd, "root:x:0:0:root:/root:"+shell)
		addedRoot = true
	}
	newPasswd = appendLine(newPasswd, fmt.Sprintf("%s:x:%d:%d::/%s:%s", userName, userID, userID, userHome, shell))

	group, _, err := r.readFile("etc/group")
	if err != nil {
		return err
	}
	newGroup := group
	if !hasEntry(newGroup, "root") {
		newGroup = appendLine(newGroup, "root:x:0:")
	}
	if !hasEntry(newGroup, userName) {
		newGroup = appendLine(newGroup, fmt.Sprintf("%s:x:%d:", userName, userID))
	}

	if err := r.writeFile("etc/passwd", newPasswd, 0o644); err != nil {
		return err
	}
	if !bytes.Equal(group, newGroup) {
		if err := r.writeFile("etc/group", newGroup, 0o644); err != nil {
			return err
		}
	}
	// Only where the image keeps shadow passwords: a locked password.
	if shadow, ok, err := r.readFile("etc/shadow"); err != nil {
		return err
	} else if ok && !hasEntry(shadow, userName) {
		if err := r.writeFile("etc/shadow", appendLine(shadow, userName+":!::0:99999:7:::"), 0o640); err != nil {
			return err
		}
	}
	if addedRoot {
		if _, err := r.mkdirOwned("root", 0, 0, 0o700); err != nil {
			return err
		}
	}
	created, err := r.mkdirOwned(userHome, userID, userID, 0o755)
	if err != nil {
		return err
	}
	if created {
		if err := r.copyTopFiles("etc/skel", userHome, userID, userID); err != nil {
			return err
		}
	}
	// Like the base template: where sudo is installed, `user` may use it
	// without a password.
	if r.exists("etc/sudoers.d") && !r.exists("etc/sudoers.d/"+userName) {
		if err := r.writeFile("etc/sudoers.d/"+userName, []byte(userName+" ALL=(ALL:ALL) NOPASSWD: ALL\n"), 0o440); err != nil {
			return err
		}
	}
	return nil
}

// hasEntry reports whether a colon-separated account file has an entry
// called name.
func hasEntry(file []byte, name string) bool {
	prefix := []byte(name + ":")
	for line := range bytes.SplitSeq(file, []byte("\n")) {
		if bytes.HasPrefix(line, prefix) {
			return true
		}
	}
	return false
}

// appendLine adds line to file, first ending its last line if needed.
func appendLine(file []byte, line string) []byte {
	out := bytes.Clone(file)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(append(out, line...), '\n')
}
