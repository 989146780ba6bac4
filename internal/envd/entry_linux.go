package envd

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
)

// statEntry describes the file at path without following a final symlink.
func statEntry(db *userDB, path string) (*filesystem.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("stating %s: %w", path, err)
	}
	return entryFromInfo(db, path, fi), nil
}

func entryFromInfo(db *userDB, path string, fi fs.FileInfo) *filesystem.EntryInfo {
	name := fi.Name()
	if path == "/" {
		name = "/"
	}
	e := &filesystem.EntryInfo{
		Name:         name,
		Path:         path,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  permString(fi.Mode()),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Mode = st.Mode & 0o7777
		e.Owner = db.userName(st.Uid)
		e.Group = db.groupName(st.Gid)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			// Dangling: report where it points.
			target, err = os.Readlink(path)
		}
		if err == nil {
			e.SymlinkTarget = &target
		}
	case fi.IsDir():
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
	default:
		// Devices, fifos and sockets too: the SDK drops unknown types.
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		e.Metadata = readMetadata(path)
	}
	return e
}

// permString renders a mode like ls -l does ("drwxr-xr-x", "-rwsr-xr-x").
// Go's FileMode.String differs for special files and bits.
func permString(m fs.FileMode) string {
	var b strings.Builder
	switch {
	case m.IsDir():
		b.WriteByte('d')
	case m&fs.ModeSymlink != 0:
		b.WriteByte('l')
	case m&fs.ModeNamedPipe != 0:
		b.WriteByte('p')
	case m&fs.ModeSocket != 0:
		b.WriteByte('s')
	case m&fs.ModeCharDevice != 0:
		b.WriteByte('c')
	case m&fs.ModeDevice != 0:
		b.WriteByte('b')
	default:
		b.WriteByte('-')
	}
	const rwx = "rwxrwxrwx"
	for i := range 9 {
		c := byte('-')
		if m&(1<<(8-i)) != 0 {
			c = rwx[i]
		}
		special := false
		switch i {
		case 2:
			special = m&fs.ModeSetuid != 0
		case 5:
			special = m&fs.ModeSetgid != 0
		case 8:
			special = m&fs.ModeSticky != 0
		}
		if special {
			s := byte('s')
			if i == 8 {
				s = 't'
			}
			if c == '-' {
				s -= 'a' - 'A'
			}
			c = s
		}
		b.WriteByte(c)
	}
	return b.String()
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
