package envd

import (
	"fmt"
	"io/fs"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// fileOwner returns the owner, group and raw mode bits of fi.
func fileOwner(fi fs.FileInfo) (uid, gid, mode uint32, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, 0, false
	}
	return st.Uid, st.Gid, st.Mode, true
}

// File metadata lives in user.e2b.* extended attributes, where E2B's SDKs
// document it (keys are lowercase; the prefix is not part of the key).
const metadataXattrPrefix = "user.e2b."

func readMetadata(path string) map[string]string {
	size, err := unix.Llistxattr(path, nil)
	if err != nil || size <= 0 {
		return nil
	}
	buf := make([]byte, size)
	size, err = unix.Llistxattr(path, buf)
	if err != nil {
		return nil
	}
	var md map[string]string
	for _, name := range strings.Split(string(buf[:size]), "\x00") {
		key, ok := strings.CutPrefix(name, metadataXattrPrefix)
		if !ok || key == "" {
			continue
		}
		val := make([]byte, 4096)
		n, err := unix.Lgetxattr(path, name, val)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(val[:n])
	}
	return md
}

func writeMetadata(path string, md map[string]string) error {
	for k, v := range md {
		if err := unix.Lsetxattr(path, metadataXattrPrefix+k, []byte(v), 0); err != nil {
			return fmt.Errorf("setting metadata %q on %s: %w", k, path, err)
		}
	}
	return nil
}

// Filesystem magic numbers (statfs f_type) of network and FUSE mounts, on
// which inotify misses remote changes.
var networkFSTypes = map[uint32]string{
	0x6969:     "nfs",
	0x517b:     "smb",
	0xff534d42: "cifs",
	0xfe534d42: "smb2",
	0x65735546: "fuse",
	0x00c36400: "ceph",
	0x5346414f: "afs",
}

// networkMount names the network filesystem path is on, or "".
func networkMount(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return ""
	}
	// f_type is a 32-bit magic, sign-extended on some ABIs.
	return networkFSTypes[uint32(st.Type)]
}
