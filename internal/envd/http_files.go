package envd

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// stalledReadTimeout reclaims a download whose client stopped reading.
const stalledReadTimeout = 5 * time.Minute

// metadataHeaderPrefix marks upload headers that become file metadata.
const metadataHeaderPrefix = "X-Metadata-"

// writeResult is one element of the POST /files answer.
type writeResult struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// fileUser picks the user of a /files request: the username parameter,
// else the Authorization header, else the default user.
func (s *Server) fileUser(r *http.Request) (*sysUser, error) {
	name := r.URL.Query().Get("username")
	if name == "" {
		var err error
		if name, err = basicAuthUser(r.Header); err != nil {
			return nil, err
		}
	}
	return s.resolveUser(name)
}

// handleGetFiles sends a file's bytes (gzip-encoded when the client
// accepts it). Missing is 404, a directory 400.
func (s *Server) handleGetFiles(w http.ResponseWriter, r *http.Request) {
	u, err := s.fileUser(r)
	if err != nil {
		writeHTTPError(w, err)
		return
	}
	raw := r.URL.Query().Get("path")
	if raw == "" {
		writeHTTPError(w, fmt.Errorf("reading file: %w: path is required", errInvalid))
		return
	}
	p := resolvePath(u, raw)
	f, err := os.Open(p)
	if err != nil {
		writeHTTPError(w, fmt.Errorf("reading %s: %w", p, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeHTTPError(w, fmt.Errorf("reading %s: %w", p, err))
		return
	}
	if fi.IsDir() {
		writeHTTPError(w, fmt.Errorf("reading %s: %w: it is a directory", p, errInvalid))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": fi.Name()}))
	h.Set("Cache-Control", "no-store")
	h.Add("Vary", "Accept-Encoding")
	dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
	gzipped := acceptsGzip(r) && r.Header.Get("Range") == ""
	if fi.Size() > 0 && !gzipped {
		http.ServeContent(dw, r, "", fi.ModTime(), f)
		return
	}
	// Sent as read, without ranges: compressed, or a file that says it
	// is empty, which it may not be (/proc's are made as they are read,
	// and cannot seek to their end, which ranges need: that was a 500).
	var out io.Writer = dw
	if gzipped {
		h.Set("Content-Encoding", "gzip")
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	var gz *gzip.Writer
	if gzipped {
		gz, _ = gzip.NewWriterLevel(dw, gzip.BestSpeed)
		out = gz
	}
	if _, err := io.Copy(out, f); err != nil {
		s.log.Debug("sending file", "path", p, "err", err)
		return
	}
	if gz != nil {
		_ = gz.Close()
	}
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") && strings.ReplaceAll(params, " ", "") != "q=0" {
			return true
		}
	}
	return false
}

// deadlineWriter pushes the write deadline forward on every write, so a
// download may take as long as it needs but not stall forever.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	_ = d.rc.SetWriteDeadline(time.Now().Add(stalledReadTimeout))
	return d.ResponseWriter.Write(p)
}

// handlePostFiles writes uploaded files, creating parent directories, all
// owned by the user. The body is either multipart/form-data, with one
// "file" part per file, or the raw bytes of one file
// (application/octet-stream, possibly gzip-encoded). A part's target is the
// path parameter, or else its filename: that is how the SDK uploads several
// files in one request. X-Metadata-<key> headers become file metadata.
func (s *Server) handlePostFiles(w http.ResponseWriter, r *http.Request) {
	// A login shell's start-up may read what this writes.
	defer s.shells.changed(readyShellQuiet)
	u, err := s.fileUser(r)
	if err != nil {
		writeHTTPError(w, err)
		return
	}
	md, err := uploadMetadata(r.Header)
	if err != nil {
		writeHTTPError(w, err)
		return
	}
	body := io.Reader(r.Body)
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			writeHTTPError(w, fmt.Errorf("reading upload: %w: bad gzip body: %v", errInvalid, err))
			return
		}
		defer gz.Close()
		body = gz
	}
	qpath := r.URL.Query().Get("path")
	results := []writeResult{}
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct == "multipart/form-data" {
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeHTTPError(w, fmt.Errorf("reading upload: %w: %v", errInvalid, err))
				return
			}
			if part.FormName() != "file" {
				continue
			}
			target := qpath
			if target == "" {
				target = partFilename(part)
			}
			if target == "" {
				writeHTTPError(w, fmt.Errorf("reading upload: %w: no path parameter and no filename in the part", errInvalid))
				return
			}
			res, err := s.writeFile(u, target, part, md)
			if err != nil {
				writeHTTPError(w, err)
				return
			}
			results = append(results, res)
		}
		if len(results) == 0 {
			writeHTTPError(w, fmt.Errorf("reading upload: %w: no \"file\" part", errInvalid))
			return
		}
	} else {
		if qpath == "" {
			writeHTTPError(w, fmt.Errorf("reading upload: %w: path is required", errInvalid))
			return
		}
		res, err := s.writeFile(u, qpath, body, md)
		if err != nil {
			writeHTTPError(w, err)
			return
		}
		results = append(results, res)
	}
	writeJSON(w, http.StatusOK, results)
}

// partFilename returns the raw filename of a part. multipart.Part.FileName
// strips directories, but here the filename is the target path.
func partFilename(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	// Fetch implementations percent-escape these three in form filenames.
	return strings.NewReplacer("%22", `"`, "%0A", "\n", "%0D", "\r").Replace(params["filename"])
}

// uploadMetadata collects X-Metadata-<key> headers; keys are lowercased
// (HTTP does not keep their case anyway).
func uploadMetadata(h http.Header) (map[string]string, error) {
	var md map[string]string
	for k, vs := range h {
		if len(k) <= len(metadataHeaderPrefix) || !strings.EqualFold(k[:len(metadataHeaderPrefix)], metadataHeaderPrefix) || len(vs) == 0 {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[strings.ToLower(k[len(metadataHeaderPrefix):])] = vs[0]
	}
	return md, nil
}

// writeFile stores src at target (resolved for u), replacing an existing
// file in place (through a symlink, as a plain write goes) so that its
// owner and mode stay and watchers see a write, as E2B's envd does; a file
// it creates belongs to u. An upload that breaks off loses nothing: a new
// file is removed again, and the new content of an existing one is first
// spooled aside and copied over it only once complete.
func (s *Server) writeFile(u *sysUser, target string, src io.Reader, md map[string]string) (writeResult, error) {
	p := resolvePath(u, target)
	if real, err := filepath.EvalSymlinks(p); err == nil {
		p = real
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return writeResult{}, fmt.Errorf("writing %s: %w: it is a directory", p, errInvalid)
	}
	if _, err := mkdirAll(u, filepath.Dir(p)); err != nil {
		return writeResult{}, fmt.Errorf("writing %s: %w", p, err)
	}
	_, statErr := os.Lstat(p)
	exists := statErr == nil
	body := io.Reader(&uploadReader{r: src})
	if exists {
		spooled, err := spool(body)
		if err != nil {
			return writeResult{}, uploadError(p, err)
		}
		defer spooled.Close()
		body = spooled
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return writeResult{}, fmt.Errorf("writing %s: %w", p, err)
	}
	if !exists {
		if err := chownNew(u, p); err != nil {
			f.Close()
			os.Remove(p)
			return writeResult{}, err
		}
	}
	if _, err := io.Copy(f, body); err != nil {
		f.Close()
		if !exists {
			os.Remove(p)
		}
		return writeResult{}, uploadError(p, err)
	}
	if err := f.Close(); err != nil {
		return writeResult{}, fmt.Errorf("writing %s: %w", p, err)
	}
	if len(md) > 0 {
		if err := writeMetadata(p, md); err != nil {
			return writeResult{}, err
		}
	}
	s.log.Debug("file written", "path", p, "user", u.Name)
	return writeResult{Path: p, Name: filepath.Base(p), Type: "file", Metadata: md}, nil
}

// spool copies an upload into an unnamed temporary file (outside any
// directory a client watches) and returns it rewound; the file goes when
// it is closed.
func spool(r io.Reader) (*os.File, error) {
	f, err := os.CreateTemp("", ".envd-upload-*")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name())
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// uploadError says what went wrong writing p: a body that broke off is
// the client's error.
func uploadError(p string, err error) error {
	var re uploadReadError
	if errors.As(err, &re) {
		return fmt.Errorf("writing %s: %w: the upload broke off: %v", p, errInvalid, re.err)
	}
	return fmt.Errorf("writing %s: %w", p, err)
}

// uploadReader marks the errors of reading the client's upload, so that a
// body that breaks off is the client's fault (400), not a failure to write.
type uploadReader struct{ r io.Reader }

type uploadReadError struct{ err error }

func (e uploadReadError) Error() string { return e.err.Error() }

func (u *uploadReader) Read(b []byte) (int, error) {
	n, err := u.r.Read(b)
	if err != nil && err != io.EOF {
		err = uploadReadError{err}
	}
	return n, err
}
