package console

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"strings"
)

// The console's files, in the binary. assets/vendor holds third-party
// files copied from npm by `make console-assets` (versions and lockfile
// in web/); they are committed, so that a fresh clone builds with
// `go build` alone, without npm.
//
//go:embed all:assets
var embedded embed.FS

// Assets is the console's files, as served under Path.
func Assets() fs.FS {
	sub, err := fs.Sub(embedded, "assets")
	if err != nil {
		panic(err) // the directory is embedded: it exists
	}
	return sub
}

// assetHandler serves Assets with an ETag each (their hashes: embedded
// files have no modification time), revalidated on every load so that a
// new binary's files are picked up at once. Directories are not listed.
func assetHandler() http.Handler {
	files := Assets()
	etags := map[string]string{}
	_ = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		etags["/"+p] = `"` + hex.EncodeToString(sum[:8]) + `"`
		return nil
	})
	fileServer := http.FileServerFS(files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p == "/" {
			p = "/index.html"
		}
		etag, ok := etags[p]
		if !ok || strings.HasSuffix(r.URL.Path, "/index.html") {
			// Unknown, a directory, or index.html by name (which the
			// file server would redirect to the directory).
			writeError(w, http.StatusNotFound, "no console page "+r.URL.Path)
			return
		}
		w.Header().Set("ETag", etag)
		w.Header().Set("Cache-Control", "no-cache")
		fileServer.ServeHTTP(w, r)
	})
}
