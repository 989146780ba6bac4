package envd

import (
	"net/http"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem/filesystemconnect"
)

// filesystemService implements filesystem.Filesystem; each RPC is in its
// own fs_*.go file. Operations run as root but resolve relative paths
// against the requesting user's home and give what they create to that user.
type filesystemService struct {
	s *Server
}

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

// requestContext resolves the user of an RPC and loads the user database
// used to name owners.
func (fsvc *filesystemService) requestContext(h http.Header) (*sysUser, *userDB, error) {
	name, err := basicAuthUser(h)
	if err != nil {
		return nil, nil, err
	}
	return fsvc.s.resolveUserIn(name)
}
