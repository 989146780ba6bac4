//go:build !linux

package image

import (
	"archive/tar"
	"errors"
	"io"
	"log/slog"
)

// Unpacking relies on openat2(RESOLVE_IN_ROOT) to stay inside the root.
var errUnsupported = errors.New("unpacking images needs Linux")

type rootFS struct{}

func openRoot(string) (*rootFS, error) { return nil, errUnsupported }

func (r *rootFS) close() {}

func (r *rootFS) readFile(string) ([]byte, bool, error) { return nil, false, errUnsupported }

func (r *rootFS) writeFile(string, []byte, uint32) error { return errUnsupported }

func (r *rootFS) isExecutable(string) bool { return false }

func (r *rootFS) exists(string) bool { return false }

func (r *rootFS) mkdirOwned(string, int, int, uint32) (bool, error) { return false, errUnsupported }

func (r *rootFS) copyTopFiles(string, string, int, int) error { return errUnsupported }

type unpacker struct{ layer layerState }

func newUnpacker(*rootFS, *slog.Logger) *unpacker { return &unpacker{} }

func (u *unpacker) create(string, string, string, *tar.Header, io.Reader) error {
	return errUnsupported
}

func (u *unpacker) rootMeta(*tar.Header) error { return errUnsupported }

func (u *unpacker) endLayer() error { return errUnsupported }

func (u *unpacker) whiteout(string, string) error { return errUnsupported }

func (u *unpacker) opaque(string) error { return errUnsupported }
