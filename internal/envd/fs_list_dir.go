package envd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
)

// ListDir lists a directory down to depth levels (1 when unset). Symlinked
// directories are listed but not descended into, so loops cannot happen.
func (fsvc *filesystemService) ListDir(_ context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	u, db, err := fsvc.requestContext(req.Header())
	if err != nil {
		return nil, connectError(err)
	}
	dir := resolvePath(u, req.Msg.GetPath())
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, connectError(fmt.Errorf("listing %s: %w", dir, err))
	}
	if !fi.IsDir() {
		return nil, connectError(fmt.Errorf("listing %s: %w: not a directory", dir, errInvalid))
	}
	depth := req.Msg.GetDepth()
	if depth == 0 {
		depth = 1
	}
	res := &filesystem.ListDirResponse{}
	if err := listInto(db, dir, depth, &res.Entries); err != nil {
		return nil, connectError(fmt.Errorf("listing %s: %w", dir, err))
	}
	return connect.NewResponse(res), nil
}

// listInto appends dir's entries, recursing depth-1 more levels. Only the
// top directory's errors count; subdirectories that vanish or cannot be
// read are skipped.
func listInto(db *userDB, dir string, depth uint32, out *[]*filesystem.EntryInfo) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, de := range ents {
		p := filepath.Join(dir, de.Name())
		fi, err := de.Info()
		if err != nil {
			continue
		}
		*out = append(*out, entryFromInfo(db, p, fi))
		if depth > 1 && de.IsDir() {
			_ = listInto(db, p, depth-1, out)
		}
	}
	return nil
}
