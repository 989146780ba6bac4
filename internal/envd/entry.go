package envd

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

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
	if uid, gid, mode, ok := fileOwner(fi); ok {
		e.Mode = mode & 0o7777
		e.Owner = db.userName(uid)
		e.Group = db.groupName(gid)
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
