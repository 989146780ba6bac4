package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// OCI whiteouts: `.wh.NAME` deletes NAME from the layers below;
// `.wh..wh..opq` in a directory hides everything the layers below put there.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// xattrPrefix marks a tar entry's extended attributes in its PAX records.
const xattrPrefix = "SCHILY.xattr."

// unpackLayer applies one layer, as stored (gzip, zstd or plain tar), to
// the tree behind u. It reads the layer to its end, so that a digest
// check at EOF (remote and OCI layout blobs) happens before the tree is
// used. What the layer unpacks to counts against limit (nil: no bound).
func unpackLayer(ctx context.Context, u *unpacker, rc io.Reader, limit *budget) error {
	br := bufio.NewReaderSize(rc, 1<<20)
	raw, closeDec, err := decompress(br)
	if err != nil {
		return err
	}
	defer closeDec()
	dec := &limitedReader{r: raw, limit: limit}
	tr := tar.NewReader(dec)
	u.beginLayer()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading tar: %w", err)
		}
		if isSparse(hdr) {
			// The tar reader makes a sparse file's holes up as zeros
			// without reading them from the layer: a few hundred bytes
			// of layer could declare a file of exabytes. Its whole size
			// counts, before any of it is written.
			if err := limit.take(hdr.Size); err != nil {
				return err
			}
		}
		if err := u.entry(hdr, tr); err != nil {
			return err
		}
	}
	if _, err := io.Copy(io.Discard, dec); err != nil {
		return fmt.Errorf("reading past the tar's end: %w", err)
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return fmt.Errorf("reading past the tar's end: %w", err)
	}
	return u.endLayer()
}

// isSparse reports whether hdr is a sparse file, in the old GNU format or
// as PAX records.
func isSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// decompress recognises the layer's compression by its magic bytes rather
// than by media type, which registries and tools get wrong.
func decompress(br *bufio.Reader) (io.Reader, func(), error) {
	magic, err := br.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("reading layer: %w", err)
	}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("reading gzip layer: %w", err)
		}
		return zr, func() { zr.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, fmt.Errorf("reading zstd layer: %w", err)
		}
		return zr, zr.Close, nil
	case bytes.HasPrefix(magic, []byte("BZh")):
		return bzip2.NewReader(br), func() {}, nil
	default:
		return br, func() {}, nil
	}
}

// cleanPath turns a tar entry name into a slash-separated path relative
// to the root ("" is the root itself). Any ".." component is refused, even
// one that would stay inside after cleaning: no honest layer has one.
func cleanPath(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("%w: entry %q has a NUL byte", ErrUnsafeLayer, name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: entry %q", ErrUnsafeLayer, name)
		}
	}
	return strings.TrimPrefix(path.Clean("/"+name), "/"), nil
}

// splitPath splits a cleaned path into its directory ("" for the root)
// and last element.
func splitPath(rel string) (dir, base string) {
	dir, base = path.Split(rel)
	return strings.TrimSuffix(dir, "/"), base
}

// layerState is what the unpacker remembers about the layer being applied.
type layerState struct {
	// seen holds every path this layer created, and their parents: a
	// whiteout or opaque marker only hides what lower layers put there.
	seen map[string]struct{}
	// dirTimes are set when the layer is done: creating entries inside a
	// directory changes its modification time.
	dirTimes []dirTime
}

type dirTime struct {
	rel    string
	header *tar.Header
}

func (u *unpacker) beginLayer() {
	u.layer = layerState{seen: make(map[string]struct{})}
}

func (u *unpacker) markSeen(rel string) {
	for rel != "" {
		if _, ok := u.layer.seen[rel]; ok {
			return
		}
		u.layer.seen[rel] = struct{}{}
		rel, _ = splitPath(rel)
	}
}

func (u *unpacker) wasSeen(rel string) bool {
	_, ok := u.layer.seen[rel]
	return ok
}

// entry applies one tar entry.
func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanPath(hdr.Name)
	if err != nil {
		return err
	}
	dir, base := splitPath(rel)
	if strings.HasPrefix(base, whiteoutPrefix) {
		if base == opaqueMarker {
			return u.opaque(dir)
		}
		target := strings.TrimPrefix(base, whiteoutPrefix)
		if target == "" || target == "." || target == ".." || strings.Contains(target, "/") {
			return fmt.Errorf("%w: whiteout %q", ErrUnsafeLayer, hdr.Name)
		}
		if u.wasSeen(path.Join(dir, target)) {
			return nil
		}
		return u.whiteout(dir, target)
	}
	if rel == "" {
		if hdr.Typeflag == tar.TypeDir {
			return u.rootMeta(hdr)
		}
		return nil
	}
	u.markSeen(rel)
	return u.create(dir, base, rel, hdr, r)
}
