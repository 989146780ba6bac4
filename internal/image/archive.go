package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// archiveManifest is one image of a `docker save` tarball's manifest.json.
type archiveManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// openArchive resolves a docker archive: the image tagged ref, or the only
// one when ref is empty. The tarball is read as it is; layers stored
// uncompressed are not recompressed.
func openArchive(file, ref string) (*imageSource, error) {
	if st, err := os.Stat(file); err != nil || st.IsDir() {
		return nil, fmt.Errorf("%w: docker archive %s: not a file", ErrNotFound, file)
	}
	raw, _, err := readArchiveEntry(file, "manifest.json", 1<<20)
	if err != nil {
		return nil, fmt.Errorf("reading docker archive %s: %w", file, err)
	}
	var ms []archiveManifest
	if err := json.Unmarshal(raw, &ms); err != nil {
		return nil, fmt.Errorf("reading docker archive %s: manifest.json: %w", file, err)
	}
	m, err := chooseArchiveImage(ms, ref)
	if err != nil {
		return nil, fmt.Errorf("docker archive %s: %w", file, err)
	}
	cfgRaw, _, err := readArchiveEntry(file, m.Config, 16<<20)
	if err != nil {
		return nil, fmt.Errorf("reading docker archive %s: %w", file, err)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(cfgRaw))
	if err != nil {
		return nil, fmt.Errorf("reading docker archive %s: image config: %w", file, err)
	}
	sum := sha256.Sum256(cfgRaw)
	src := &imageSource{digest: "sha256:" + hex.EncodeToString(sum[:]), config: cfg}
	for _, lp := range m.Layers {
		_, size, err := findArchiveEntry(file, lp, false)
		if err != nil {
			return nil, fmt.Errorf("reading docker archive %s: %w", file, err)
		}
		src.layers = append(src.layers, &layerSource{
			digest: archiveLayerDigest(lp),
			size:   size,
			open: func(context.Context) (io.ReadCloser, error) {
				rc, _, err := findArchiveEntry(file, lp, true)
				return rc, err
			},
		})
	}
	return src, nil
}

// chooseArchiveImage picks the image tagged ref (compared as normalised
// references, so "busybox" matches "docker.io/library/busybox:latest").
func chooseArchiveImage(ms []archiveManifest, ref string) (*archiveManifest, error) {
	if len(ms) == 0 {
		return nil, fmt.Errorf("%w: the archive holds no image", ErrNotFound)
	}
	var tags []string
	for _, m := range ms {
		tags = append(tags, m.RepoTags...)
	}
	if ref == "" {
		if len(ms) > 1 {
			return nil, fmt.Errorf("%w: the archive holds %d images (%s); name one as docker-archive:PATH:REF", ErrBadReference, len(ms), strings.Join(tags, ", "))
		}
		return &ms[0], nil
	}
	want, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadReference, ref, err)
	}
	for i, m := range ms {
		for _, t := range m.RepoTags {
			if got, err := name.ParseReference(t); err == nil && got.Name() == want.Name() {
				return &ms[i], nil
			}
		}
	}
	return nil, fmt.Errorf("%w: no image tagged %s in the archive (it has: %s)", ErrNotFound, ref, strings.Join(tags, ", "))
}

// archiveLayerDigest derives a layer's digest from its path where the
// archive stores layers by digest (blobs/sha256/HEX), else "".
func archiveLayerDigest(p string) string {
	if dir, file := path.Split(p); strings.HasSuffix(dir, "blobs/sha256/") && len(file) == 64 {
		return "sha256:" + file
	}
	return ""
}

// readArchiveEntry reads a whole (small) entry of a tarball.
func readArchiveEntry(file, entry string, limit int64) ([]byte, int64, error) {
	rc, size, err := findArchiveEntry(file, entry, true)
	if err != nil {
		return nil, 0, err
	}
	defer rc.Close()
	if size > limit {
		return nil, 0, fmt.Errorf("%s is too large (%d bytes)", entry, size)
	}
	b, err := io.ReadAll(io.LimitReader(rc, limit))
	return b, size, err
}

// findArchiveEntry locates entry in the tarball, following the symbolic
// and hard links newer docker versions store layers behind. With open it
// returns a reader of the entry's content (closing it closes the file).
func findArchiveEntry(file, entry string, open bool) (io.ReadCloser, int64, error) {
	want := path.Clean(entry)
	for hops := 0; hops < 8; hops++ {
		f, err := os.Open(file)
		if err != nil {
			return nil, 0, err
		}
		tr := tar.NewReader(f)
		var next string
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				f.Close()
				return nil, 0, fmt.Errorf("%w: %s not in the archive", ErrNotFound, entry)
			}
			if err != nil {
				f.Close()
				return nil, 0, err
			}
			if path.Clean(hdr.Name) != want {
				continue
			}
			switch hdr.Typeflag {
			case tar.TypeSymlink:
				next = path.Join(path.Dir(want), hdr.Linkname)
			case tar.TypeLink:
				next = path.Clean(hdr.Linkname)
			case tar.TypeReg:
				if !open {
					f.Close()
					return nil, hdr.Size, nil
				}
				return struct {
					io.Reader
					io.Closer
				}{tr, f}, hdr.Size, nil
			default:
				f.Close()
				return nil, 0, fmt.Errorf("%s in the archive is not a file", entry)
			}
			break
		}
		f.Close()
		want = next
	}
	return nil, 0, fmt.Errorf("%s in the archive: too many links", entry)
}
