// Package transfer moves a set of files from one node to another in
// chunks when no store the nodes share holds them (a snapshot, and the
// template it runs on, going to the node that restores it). Each file is
// checked against its size and sha256 once whole, and a transfer cut
// midway resumes: the receiver keeps what it got and says how much of
// each file it has, and the sender starts each file there. It is pure
// (files and hashes only); the node's side (node, nodeserver) uses it,
// and the server relays its parts between the nodes over the node API.
package transfer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ChunkSize is how much of a file one part carries: large enough that a
// part's overhead (a request on the receiving side) is small against it,
// small enough to be held in memory a few at a time.
const ChunkSize = 1 << 20

// Areas a file's name may begin with: what the file belongs to.
const (
	AreaSnapshot = "snapshot"
	AreaTemplate = "template"
)

// ErrInvalid classifies a name, offset or file list that a transfer
// cannot take.
var ErrInvalid = errors.New("invalid transfer")

// ErrMismatch classifies a received file whose size or checksum is not
// the sender's: it is dropped, and sent again from its start.
var ErrMismatch = errors.New("received file does not match")

// File is one file of a transfer as its sender describes it.
type File struct {
	// Name is an area and a base name: "snapshot/pages.img".
	Name string
	Size int64
	// SHA256 is the hex digest of the whole file.
	SHA256 string
}

// Source is a file to send: its name in the transfer and its path.
type Source struct {
	Name string
	Path string
}

// ValidName reports whether name is an area and one plain path element,
// so that a receiver never writes outside its directory.
func ValidName(name string) bool {
	area, base, ok := strings.Cut(name, "/")
	if !ok || (area != AreaSnapshot && area != AreaTemplate) {
		return false
	}
	return base != "" && base != "." && base != ".." && !strings.ContainsAny(base, `/\`) && !strings.HasPrefix(base, ".")
}

// Part is what Send emits: a chunk of a file (File, Offset, Data), or,
// once a file's chunks are all sent, its description (Done).
type Part struct {
	File   string
	Offset int64
	// Data is valid only until emit returns.
	Data []byte
	Done *File
}

// Send emits the chunks of each source from the offset the receiver has
// of it (offsets, by name; none: from the start), then its description.
// A file is read once: the part before its offset is hashed, not sent.
// emit's error ends Send (wrapped).
func Send(ctx context.Context, srcs []Source, offsets map[string]int64, emit func(Part) error) error {
	buf := make([]byte, ChunkSize)
	for _, src := range srcs {
		if !ValidName(src.Name) {
			return fmt.Errorf("sending %s: %w: bad name", src.Name, ErrInvalid)
		}
		if err := sendFile(ctx, src, offsets[src.Name], buf, emit); err != nil {
			return err
		}
	}
	return nil
}

func sendFile(ctx context.Context, src Source, off int64, buf []byte, emit func(Part) error) error {
	f, err := os.Open(src.Path)
	if err != nil {
		return fmt.Errorf("sending %s: %w", src.Name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("sending %s: %w", src.Name, err)
	}
	size := fi.Size()
	if off < 0 || off > size {
		// What the receiver has is not a prefix of this file: all of it
		// goes again, and the receiver's copy fails its check first.
		off = size
	}
	h := sha256.New()
	if _, err := io.CopyN(h, f, off); err != nil {
		return fmt.Errorf("sending %s: hashing its first %d bytes: %w", src.Name, off, err)
	}
	pos := off
	for pos < size {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("sending %s: %w", src.Name, err)
		}
		k, err := io.ReadFull(f, buf[:min(int64(len(buf)), size-pos)])
		if err != nil {
			return fmt.Errorf("sending %s at %d: %w", src.Name, pos, err)
		}
		h.Write(buf[:k])
		if err := emit(Part{File: src.Name, Offset: pos, Data: buf[:k]}); err != nil {
			return fmt.Errorf("sending %s at %d: %w", src.Name, pos, err)
		}
		pos += int64(k)
	}
	return emit(Part{Done: &File{Name: src.Name, Size: size, SHA256: hex.EncodeToString(h.Sum(nil))}})
}

// Receiver keeps the files of one transfer under a directory, each at
// <dir>/<area>/<base>, across the calls (and cuts) of the transfer. It is
// not safe for concurrent use: one transfer's steps come one at a time.
type Receiver struct {
	dir string
}

// NewReceiver receives into dir, keeping what it holds already.
func NewReceiver(dir string) *Receiver { return &Receiver{dir: dir} }

// Path is where file name is kept.
func (r *Receiver) Path(name string) string { return filepath.Join(r.dir, filepath.FromSlash(name)) }

// Dir is the directory of an area's files.
func (r *Receiver) Dir(area string) string { return filepath.Join(r.dir, area) }

// Received is how much of each file the receiver has.
func (r *Receiver) Received() (map[string]int64, error) {
	out := map[string]int64{}
	for _, area := range []string{AreaSnapshot, AreaTemplate} {
		entries, err := os.ReadDir(r.Dir(area))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing received files: %w", err)
		}
		for _, e := range entries {
			name := area + "/" + e.Name()
			if !e.Type().IsRegular() || !ValidName(name) {
				continue
			}
			fi, err := e.Info()
			if err != nil {
				return nil, fmt.Errorf("listing received files: %w", err)
			}
			out[name] = fi.Size()
		}
	}
	return out, nil
}

// Write appends data to file name, which must hold exactly offset bytes
// (what Received said, plus what was written since): a chunk sent twice
// or out of order is refused rather than written in the wrong place.
func (r *Receiver) Write(name string, offset int64, data []byte) error {
	if !ValidName(name) {
		return fmt.Errorf("receiving %q: %w: bad name", name, ErrInvalid)
	}
	p := r.Path(name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("receiving %s: %w", name, err)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("receiving %s: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("receiving %s: %w", name, err)
	}
	if fi.Size() != offset {
		return fmt.Errorf("receiving %s: %w: a chunk at %d, and %d bytes are here", name, ErrInvalid, offset, fi.Size())
	}
	if _, err := f.WriteAt(data, offset); err != nil {
		return fmt.Errorf("receiving %s: %w", name, err)
	}
	return f.Close()
}

// Verify checks that the receiver holds exactly files, each of its size
// and checksum. A file that does not match is removed (its next transfer
// starts it afresh) and the error wraps ErrMismatch; one that is short is
// kept (ErrMismatch too: the transfer was cut), and files not listed are
// removed.
func (r *Receiver) Verify(files []File) error {
	want := map[string]File{}
	for _, f := range files {
		if !ValidName(f.Name) || f.Size < 0 {
			return fmt.Errorf("verifying %q: %w", f.Name, ErrInvalid)
		}
		want[f.Name] = f
	}
	have, err := r.Received()
	if err != nil {
		return err
	}
	for name := range have {
		if _, ok := want[name]; !ok {
			os.Remove(r.Path(name))
		}
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(want)) {
		f := want[name]
		got, ok := have[name]
		switch {
		case !ok && f.Size > 0:
			errs = append(errs, fmt.Errorf("%w: %s was not received", ErrMismatch, name))
			continue
		case !ok:
			// An empty file has no chunks.
			if err := r.Write(name, 0, nil); err != nil {
				errs = append(errs, err)
			}
			got = 0
		case got < f.Size:
			errs = append(errs, fmt.Errorf("%w: %s has %d of its %d bytes", ErrMismatch, name, got, f.Size))
			continue
		}
		sum, err := hashFile(r.Path(name))
		if err != nil {
			errs = append(errs, fmt.Errorf("verifying %s: %w", name, err))
			continue
		}
		if got != f.Size || sum != f.SHA256 {
			os.Remove(r.Path(name))
			errs = append(errs, fmt.Errorf("%w: %s (%d bytes, sha256 %s; sent %d bytes, sha256 %s)", ErrMismatch, name, got, sum, f.Size, f.SHA256))
		}
	}
	return errors.Join(errs...)
}

// Clear removes everything the receiver holds.
func (r *Receiver) Clear() error { return os.RemoveAll(r.dir) }

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
