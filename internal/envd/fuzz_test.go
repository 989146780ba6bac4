package envd_test

import (
	"bytes"
	"net/url"
	"testing"
)

// FuzzFilesUpload sends envd's upload endpoint arbitrary multipart
// bodies (as the SDK's files.write does, but malformed, truncated, with
// odd file names) and paths: envd must answer every one with a status it
// means (a 4xx for the client's mistakes), never a 5xx or a crash.
func FuzzFilesUpload(f *testing.F) {
	e := newEnv(f)
	f.Add("up/a.txt", []byte("--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\r\nhello\r\n--B--\r\n"))
	f.Add("x", []byte("--B\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n"))
	f.Add("../../etc/passwd", []byte("--B--\r\n"))
	f.Add("", []byte("not multipart at all"))
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		e := *e // the same envd, reporting to this input's t
		e.t = t
		res, b := e.httpDo("POST", "/files?path="+url.QueryEscape(path), bytes.NewReader(body),
			map[string]string{"Content-Type": "multipart/form-data; boundary=B"})
		if res.StatusCode >= 500 {
			t.Fatalf("upload to %q answered %d: %s", path, res.StatusCode, b)
		}
	})
}
