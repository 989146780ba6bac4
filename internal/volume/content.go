package volume

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DefaultUID and DefaultGID own what the data plane writes unless the
// request names an owner: the sandboxes' default user.
const (
	DefaultUID = 1000
	DefaultGID = 1000
)

// maxListDepth bounds a recursive listing.
const maxListDepth = 16

// EntryStat is E2B's VolumeEntryStat.
type EntryStat struct {
	Name   string    `json:"name"`
	Path   string    `json:"path"`
	Type   string    `json:"type"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

// Content serves the data plane of this node's volumes under
// /volumecontent/{volumeID}/. Callers check the volume's token first.
func (d *Dir) Content() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /volumecontent/{volumeID}/dir", d.withRoot(listDir))
	m.HandleFunc("POST /volumecontent/{volumeID}/dir", d.withRoot(makeDir))
	m.HandleFunc("GET /volumecontent/{volumeID}/path", d.withRoot(statPath))
	m.HandleFunc("PATCH /volumecontent/{volumeID}/path", d.withRoot(updatePath))
	m.HandleFunc("DELETE /volumecontent/{volumeID}/path", d.withRoot(removePath))
	m.HandleFunc("GET /volumecontent/{volumeID}/file", d.withRoot(readFile))
	m.HandleFunc("PUT /volumecontent/{volumeID}/file", d.withRoot(writeFile))
	m.HandleFunc("/volumecontent/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
	})
	return m
}

// request is one data-plane call: the volume's root and the cleaned
// path inside it ("." for the root itself).
type request struct {
	root *os.Root
	rel  string
	w    http.ResponseWriter
	r    *http.Request
}

func (d *Dir) withRoot(fn func(*request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("volumeID")
		p, err := d.Get(id)
		if errors.Is(err, ErrNotFound) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("volume %s not found on this node", id))
			return
		}
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		root, err := os.OpenRoot(p)
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		defer root.Close()
		q := r.URL.Query().Get("path")
		// Paths are the volume's own: "/a/b" and "a/b" are the same file.
		rel := strings.TrimPrefix(path.Clean("/"+q), "/")
		if rel == "" {
			rel = "."
		}
		fn(&request{root: root, rel: rel, w: w, r: r})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

// fail answers err with its status: 404 for a missing path, 400 for a
// path that leaves the volume or names the wrong kind of file, 409 for one
// that exists.
func (q *request) fail(op string, err error) {
	msg := fmt.Sprintf("%s %s: %v", op, "/"+strings.TrimPrefix(q.rel, "."), unwrapPath(err))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		writeError(q.w, http.StatusNotFound, msg)
	case errors.Is(err, fs.ErrExist):
		writeError(q.w, http.StatusConflict, msg)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY),
		strings.Contains(err.Error(), "path escapes from parent"), errors.Is(err, errBadRequest):
		writeError(q.w, http.StatusBadRequest, msg)
	case errors.Is(err, syscall.ENOSPC):
		writeError(q.w, http.StatusInsufficientStorage, msg)
	default:
		writeError(q.w, http.StatusInternalServerError, msg)
	}
}

var errBadRequest = errors.New("bad request")

// unwrapPath drops *PathError's host path from a message.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func (q *request) stat(rel string) (EntryStat, error) {
	fi, err := q.root.Lstat(rel)
	if err != nil {
		return EntryStat{}, err
	}
	return q.entry(rel, fi), nil
}

func (q *request) entry(rel string, fi fs.FileInfo) EntryStat {
	p := "/" + strings.TrimPrefix(path.Clean(rel), ".")
	e := EntryStat{Name: fi.Name(), Path: p, Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), Mtime: fi.ModTime().UTC(), Type: "unknown"}
	if p == "/" {
		e.Name = ""
	}
	switch {
	case fi.Mode().IsRegular():
		e.Type = "file"
	case fi.IsDir():
		e.Type = "directory"
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
		e.Target, _ = q.root.Readlink(rel)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = st.Uid, st.Gid
		e.Mode = st.Mode & 0o7777
		e.Atime = time.Unix(st.Atim.Sec, st.Atim.Nsec).UTC()
		e.Ctime = time.Unix(st.Ctim.Sec, st.Ctim.Nsec).UTC()
	}
	return e
}

// owner reads uid, gid and mode from the query (defaults otherwise).
func (q *request) owner(defMode uint32) (uid, gid int, mode os.FileMode, err error) {
	v := q.r.URL.Query()
	num := func(name string, def, max uint64) (uint64, error) {
		s := v.Get(name)
		if s == "" {
			return def, nil
		}
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n > max {
			return 0, fmt.Errorf("%w: %s=%q", errBadRequest, name, s)
		}
		return n, nil
	}
	u, err := num("uid", DefaultUID, 1<<31)
	if err != nil {
		return 0, 0, 0, err
	}
	g, err := num("gid", DefaultGID, 1<<31)
	if err != nil {
		return 0, 0, 0, err
	}
	m, err := num("mode", uint64(defMode), 0o7777)
	if err != nil {
		return 0, 0, 0, err
	}
	return int(u), int(g), os.FileMode(m), nil
}

func (q *request) force() bool { return q.r.URL.Query().Get("force") == "true" }

func listDir(q *request) {
	depth := 1
	if s := q.r.URL.Query().Get("depth"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxListDepth {
			writeError(q.w, http.StatusBadRequest, fmt.Sprintf("depth must be between 1 and %d", maxListDepth))
			return
		}
		depth = n
	}
	fi, err := q.root.Stat(q.rel)
	if err != nil {
		q.fail("listing", err)
		return
	}
	if !fi.IsDir() {
		q.fail("listing", syscall.ENOTDIR)
		return
	}
	out := []EntryStat{}
	var walk func(rel string, left int) error
	walk = func(rel string, left int) error {
		f, err := q.root.Open(rel)
		if err != nil {
			return err
		}
		entries, err := f.ReadDir(-1)
		f.Close()
		if err != nil {
			return err
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
		for _, de := range entries {
			child := path.Join(rel, de.Name())
			fi, err := de.Info()
			if err != nil {
				continue // removed meanwhile
			}
			out = append(out, q.entry(child, fi))
			if de.IsDir() && left > 1 {
				if err := walk(child, left-1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(q.rel, depth); err != nil {
		q.fail("listing", err)
		return
	}
	writeJSON(q.w, http.StatusOK, out)
}

func makeDir(q *request) {
	uid, gid, mode, err := q.owner(0o755)
	if err != nil {
		q.fail("creating directory", err)
		return
	}
	if q.force() {
		err = q.mkdirAll(q.rel, mode, uid, gid)
	} else {
		err = q.root.Mkdir(q.rel, mode)
		if err == nil {
			err = q.root.Lchown(q.rel, uid, gid)
		}
	}
	if err != nil {
		q.fail("creating directory", err)
		return
	}
	q.root.Chmod(q.rel, mode) // past the umask
	e, err := q.stat(q.rel)
	if err != nil {
		q.fail("creating directory", err)
		return
	}
	writeJSON(q.w, http.StatusCreated, e)
}

// mkdirAll makes rel and its missing parents, each owned by uid:gid.
func (q *request) mkdirAll(rel string, mode os.FileMode, uid, gid int) error {
	if rel == "." {
		return nil
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		err := q.root.Mkdir(p, mode)
		if errors.Is(err, fs.ErrExist) {
			if fi, serr := q.root.Stat(p); serr == nil && fi.IsDir() {
				continue
			}
			return err
		}
		if err != nil {
			return err
		}
		if err := q.root.Lchown(p, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

func statPath(q *request) {
	e, err := q.stat(q.rel)
	if err != nil {
		q.fail("reading", err)
		return
	}
	writeJSON(q.w, http.StatusOK, e)
}

func updatePath(q *request) {
	var body struct {
		UID  *uint32 `json:"uid"`
		GID  *uint32 `json:"gid"`
		Mode *uint32 `json:"mode"`
	}
	if err := json.NewDecoder(io.LimitReader(q.r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(q.w, http.StatusBadRequest, "reading the request body: "+err.Error())
		return
	}
	if _, err := q.root.Lstat(q.rel); err != nil {
		q.fail("updating", err)
		return
	}
	if body.UID != nil || body.GID != nil {
		uid, gid := -1, -1
		if body.UID != nil {
			uid = int(*body.UID)
		}
		if body.GID != nil {
			gid = int(*body.GID)
		}
		if err := q.root.Lchown(q.rel, uid, gid); err != nil {
			q.fail("updating", err)
			return
		}
	}
	if body.Mode != nil {
		if *body.Mode > 0o7777 {
			writeError(q.w, http.StatusBadRequest, fmt.Sprintf("mode %o is not a permission mode", *body.Mode))
			return
		}
		if err := q.root.Chmod(q.rel, os.FileMode(*body.Mode)); err != nil {
			q.fail("updating", err)
			return
		}
	}
	statPath(q)
}

func removePath(q *request) {
	if q.rel == "." {
		writeError(q.w, http.StatusBadRequest, "the volume's root cannot be removed (delete the volume instead)")
		return
	}
	if _, err := q.root.Lstat(q.rel); err != nil {
		q.fail("removing", err)
		return
	}
	if err := q.root.RemoveAll(q.rel); err != nil {
		q.fail("removing", err)
		return
	}
	q.w.WriteHeader(http.StatusNoContent)
}

func readFile(q *request) {
	// Non-blocking: a FIFO a sandbox made would otherwise hold the open
	// (and this request) for good; it is refused below as not a file.
	f, err := q.root.OpenFile(q.rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		q.fail("reading", err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		q.fail("reading", err)
		return
	}
	if !fi.Mode().IsRegular() {
		q.fail("reading", syscall.EISDIR)
		return
	}
	q.w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(q.w, q.r, fi.Name(), fi.ModTime(), f)
}

// writeFile writes the body to a temporary file beside the target and
// renames it over: a broken upload never leaves half a file, and readers
// see the old content or the new.
func writeFile(q *request) {
	if q.rel == "." {
		q.fail("writing", syscall.EISDIR)
		return
	}
	uid, gid, mode, err := q.owner(0o644)
	if err != nil {
		q.fail("writing", err)
		return
	}
	dir := path.Dir(q.rel)
	if q.force() {
		if err := q.mkdirAll(dir, 0o755, uid, gid); err != nil {
			q.fail("writing", err)
			return
		}
	}
	if fi, err := q.root.Lstat(q.rel); err == nil && fi.IsDir() {
		q.fail("writing", syscall.EISDIR)
		return
	}
	tmp := path.Join(dir, ".aenv-upload-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	f, err := q.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		q.fail("writing", err)
		return
	}
	_, err = io.Copy(f, q.r.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = q.root.Lchown(tmp, uid, gid)
	}
	if err == nil {
		err = q.root.Chmod(tmp, mode)
	}
	if err == nil {
		err = q.root.Rename(tmp, q.rel)
	}
	if err != nil {
		q.root.Remove(tmp)
		q.fail("writing", err)
		return
	}
	e, err := q.stat(q.rel)
	if err != nil {
		q.fail("writing", err)
		return
	}
	writeJSON(q.w, http.StatusCreated, e)
}
