package envd_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
	"github.com/aenvhq/aenv/internal/envd/spec/process"

	"github.com/aenvhq/aenv/internal/envd"
)

type written struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata"`
}

// multipartBody builds a form with one "file" part per (filename, data).
func multipartBody(t *testing.T, files ...[2]string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+f[0]+`"`)
		h.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(h)
		must(t, err)
		_, err = w.Write([]byte(f[1]))
		must(t, err)
	}
	must(t, mw.Close())
	return mw.FormDataContentType(), &buf
}

func decodeWritten(t *testing.T, res *http.Response, body []byte) []written {
	t.Helper()
	if res.StatusCode != 200 {
		t.Fatalf("upload: %d %s", res.StatusCode, body)
	}
	var out []written
	must(t, json.Unmarshal(body, &out))
	return out
}

func TestFilesRoundTrip(t *testing.T) {
	e := newEnv(t)
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	uid, gid := testIDs()

	check := func(path string) {
		t.Helper()
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s on disk differs (%d bytes, %v)", path, len(got), err)
		}
		fi, err := os.Stat(path)
		must(t, err)
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid || int(st.Gid) != gid {
			t.Fatalf("%s owned by %d:%d, want %d:%d", path, st.Uid, st.Gid, uid, gid)
		}
		for _, enc := range []string{"", "gzip"} {
			status, got := e.download(path, enc)
			if status != 200 || !bytes.Equal(got, data) {
				t.Fatalf("download (%q) of %s: %d, %d bytes", enc, path, status, len(got))
			}
		}
	}

	// multipart with the path as a parameter; parents are created.
	ct, body := multipartBody(t, [2]string{"ignored-name", string(data)})
	res, b := e.httpDo("POST", "/files?path=up/multi.bin", body, map[string]string{"Content-Type": ct})
	out := decodeWritten(t, res, b)
	want := filepath.Join(e.home, "up/multi.bin")
	if len(out) != 1 || out[0].Path != want || out[0].Name != "multi.bin" || out[0].Type != "file" {
		t.Fatalf("upload answer %+v", out)
	}
	check(want)

	// raw octet-stream
	res, b = e.httpDo("POST", "/files?path="+url.QueryEscape(filepath.Join(e.home, "raw.bin")), bytes.NewReader(data), map[string]string{"Content-Type": "application/octet-stream"})
	out = decodeWritten(t, res, b)
	check(out[0].Path)

	// gzip-encoded octet-stream, as the SDK sends with gzip: true
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(data)
	must(t, zw.Close())
	res, b = e.httpDo("POST", "/files?path=gz.bin", &gz, map[string]string{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
	out = decodeWritten(t, res, b)
	check(out[0].Path)
}

// TestFilesOfNoSize: a file that says it is empty is sent as read, with
// or without gzip: /proc's have content all the same (and cannot seek to
// their end, which ranges need), and an empty file is an empty body.
func TestFilesOfNoSize(t *testing.T) {
	e := newEnv(t)
	empty := filepath.Join(e.home, "empty")
	must(t, os.WriteFile(empty, nil, 0o644))
	for _, tc := range []struct {
		path, want string
	}{
		{"/proc/self/status", "Name:"},
		{"/proc/meminfo", "MemTotal:"},
		{empty, ""},
	} {
		for _, enc := range []string{"", "gzip"} {
			status, got := e.download(tc.path, enc)
			if status != 200 || !strings.Contains(string(got), tc.want) || (tc.want == "" && len(got) != 0) {
				t.Fatalf("download (%q) of %s: %d, %.80q", enc, tc.path, status, got)
			}
		}
	}
}

// download GETs path through /files asking for encoding enc ("" or
// "gzip", which it then must get) and returns the status and the body,
// decoded.
func (e *env) download(path, enc string) (int, []byte) {
	e.t.Helper()
	r, err := http.NewRequest("GET", e.baseURL+"/files?"+url.Values{"path": {path}}.Encode(), nil)
	must(e.t, err)
	// Set explicitly, so that the transport does not decode for us.
	r.Header.Set("Accept-Encoding", enc)
	res, err := e.ts.Client().Do(r)
	must(e.t, err)
	defer res.Body.Close()
	body := io.Reader(res.Body)
	if res.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(res.Body)
		must(e.t, err)
		body = gz
	} else if enc == "gzip" && res.StatusCode == 200 {
		e.t.Fatalf("download of %s: gzip was asked for but not used", path)
	}
	got, err := io.ReadAll(body)
	must(e.t, err)
	return res.StatusCode, got
}

func TestFilesMultipleFilesInOneUpload(t *testing.T) {
	e := newEnv(t)
	abs := filepath.Join(t.TempDir(), "abs", "two.txt")
	// The SDK's writeFiles: no path parameter, each part's filename is its
	// target path.
	ct, body := multipartBody(t, [2]string{"dir/one.txt", "first"}, [2]string{abs, "second"})
	res, b := e.httpDo("POST", "/files", body, map[string]string{"Content-Type": ct})
	out := decodeWritten(t, res, b)
	if len(out) != 2 || out[0].Path != filepath.Join(e.home, "dir/one.txt") || out[1].Path != abs {
		t.Fatalf("upload answer %+v", out)
	}
	for p, want := range map[string]string{out[0].Path: "first", abs: "second"} {
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Fatalf("%s: %q %v", p, got, err)
		}
	}
}

func TestFilesErrors(t *testing.T) {
	e := newEnv(t)
	res, b := e.httpDo("GET", "/files?path=/no/such/file", nil, nil)
	var je struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if res.StatusCode != 404 || json.Unmarshal(b, &je) != nil || je.Code != 404 || je.Message == "" {
		t.Fatalf("missing file: %d %s", res.StatusCode, b)
	}
	res, b = e.httpDo("GET", "/files?path="+url.QueryEscape(e.home), nil, nil)
	if res.StatusCode != 400 {
		t.Fatalf("directory: %d %s", res.StatusCode, b)
	}
	res, b = e.httpDo("POST", "/files?path="+url.QueryEscape(e.home), strings.NewReader("x"), map[string]string{"Content-Type": "application/octet-stream"})
	if res.StatusCode != 400 {
		t.Fatalf("writing over a directory: %d %s", res.StatusCode, b)
	}
	res, b = e.httpDo("GET", "/files?path=x&username=nosuchuser", nil, nil)
	if res.StatusCode != 400 {
		t.Fatalf("unknown user: %d %s", res.StatusCode, b)
	}
	// An upload that breaks off is the client's error, and the file it
	// was to replace stays as it was.
	res, b = e.httpDo("POST", "/files?path=kept.txt", strings.NewReader("old"), map[string]string{"Content-Type": "application/octet-stream"})
	if res.StatusCode != 200 {
		t.Fatalf("writing: %d %s", res.StatusCode, b)
	}
	cut := "--B\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nnew content that never ends"
	res, b = e.httpDo("POST", "/files?path=kept.txt", strings.NewReader(cut), map[string]string{"Content-Type": "multipart/form-data; boundary=B"})
	if res.StatusCode != 400 {
		t.Fatalf("an upload that broke off: %d %s, want 400", res.StatusCode, b)
	}
	if got, err := os.ReadFile(filepath.Join(e.home, "kept.txt")); err != nil || string(got) != "old" {
		t.Fatalf("after a broken upload the file holds %q (%v), want it unchanged", got, err)
	}
	res, _ = e.httpDo("POST", "/files?path=fresh.txt", strings.NewReader(cut), map[string]string{"Content-Type": "multipart/form-data; boundary=B"})
	if _, err := os.Stat(filepath.Join(e.home, "fresh.txt")); res.StatusCode != 400 || err == nil {
		t.Fatalf("a new file whose upload broke off: %d, and it exists (%v)", res.StatusCode, err)
	}
	long := strings.Repeat("n", 300)
	res, b = e.httpDo("POST", "/files?path="+long, strings.NewReader("x"), map[string]string{"Content-Type": "application/octet-stream"})
	if res.StatusCode != 400 || !strings.Contains(string(b), long[:50]) {
		t.Fatalf("a file name longer than the kernel takes: %d %s, want 400 naming it", res.StatusCode, b)
	}
}

func TestFilesMetadata(t *testing.T) {
	e := newEnv(t)
	probe := filepath.Join(e.home, "probe")
	must(t, os.WriteFile(probe, nil, 0o644))
	if err := unix.Setxattr(probe, "user.e2b.probe", []byte("1"), 0); errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP) {
		t.Skip("the test filesystem has no user xattrs")
	}
	res, b := e.httpDo("POST", "/files?path=meta.txt", strings.NewReader("m"), map[string]string{
		"Content-Type": "application/octet-stream", "X-Metadata-Owner-Team": "blue",
	})
	out := decodeWritten(t, res, b)
	if out[0].Metadata["owner-team"] != "blue" {
		t.Fatalf("upload answer %+v", out)
	}
	st, err := e.fs.Stat(context.Background(), req(e, &filesystem.StatRequest{Path: "meta.txt"}, ""))
	must(t, err)
	if st.Msg.GetEntry().GetMetadata()["owner-team"] != "blue" {
		t.Fatalf("stat metadata %v", st.Msg.GetEntry().GetMetadata())
	}
}

func TestHealthEnvsInitMetrics(t *testing.T) {
	e := newEnv(t)
	if res, _ := e.httpDo("GET", "/health", nil, nil); res.StatusCode != 204 {
		t.Fatalf("/health: %d", res.StatusCode)
	}
	now := time.Now().UTC()
	init := func(body string) {
		t.Helper()
		if res, b := e.httpDo("POST", "/init", strings.NewReader(body), map[string]string{"Content-Type": "application/json"}); res.StatusCode != 204 {
			t.Fatalf("/init: %d %s", res.StatusCode, b)
		}
	}
	init(`{"envVars":{"A":"1","B":"2"},"timestamp":"` + now.Format(time.RFC3339Nano) + `"}`)
	init(`{"envVars":{"B":"3"}}`)
	// A stale request (older timestamp) changes nothing.
	init(`{"envVars":{"A":"stale"},"timestamp":"` + now.Add(-time.Minute).Format(time.RFC3339Nano) + `"}`)
	res, b := e.httpDo("GET", "/envs", nil, nil)
	var envs map[string]string
	if res.StatusCode != 200 || json.Unmarshal(b, &envs) != nil || envs["A"] != "1" || envs["B"] != "3" {
		t.Fatalf("/envs: %d %s", res.StatusCode, b)
	}

	// defaultUser and defaultWorkdir change what a bare request gets.
	wd := t.TempDir()
	must(t, os.Chmod(wd, 0o755))
	newDefault := "root"
	if os.Geteuid() != 0 {
		newDefault = "user" // only root can run requests as someone else
	}
	init(`{"defaultUser":"` + newDefault + `","defaultWorkdir":"` + wd + `"}`)
	r := e.run(bashCmd(`echo "$USER $(pwd)"`), "")
	if got := strings.TrimSpace(r.stdout.String()); got != newDefault+" "+wd {
		t.Fatalf("after /init: %q", got)
	}

	res, b = e.httpDo("GET", "/metrics", nil, nil)
	var m map[string]float64
	if res.StatusCode != 200 || json.Unmarshal(b, &m) != nil {
		t.Fatalf("/metrics: %d %s", res.StatusCode, b)
	}
	for _, k := range []string{"cpu_count", "mem_total", "mem_used", "disk_total", "disk_used", "ts"} {
		if m[k] <= 0 {
			t.Fatalf("/metrics %s = %v in %s", k, m[k], b)
		}
	}
	if pct, ok := m["cpu_used_pct"]; !ok || pct < 0 || pct > 100 {
		t.Fatalf("/metrics cpu_used_pct in %s", b)
	}
}

func TestAccessToken(t *testing.T) {
	e := newEnv(t, withToken("s3cret"))
	anon := &env{t: t, ts: e.ts, baseURL: e.baseURL, proc: e.proc, fs: e.fs}
	ctx := context.Background()

	if res, _ := anon.httpDo("GET", "/health", nil, nil); res.StatusCode != 204 {
		t.Fatalf("/health needs no token, got %d", res.StatusCode)
	}
	for _, path := range []string{"/envs", "/metrics", "/files?path=x"} {
		res, b := anon.httpDo("GET", path, nil, nil)
		if res.StatusCode != 401 || !strings.Contains(string(b), `"code":401`) {
			t.Fatalf("%s without token: %d %s", path, res.StatusCode, b)
		}
	}
	if res, _ := anon.httpDo("POST", "/init", strings.NewReader(`{"accessToken":"mine"}`), nil); res.StatusCode != 401 {
		t.Fatalf("/init without the token: %d", res.StatusCode)
	}
	wrong := &env{t: t, ts: e.ts, baseURL: e.baseURL, token: "wrong"}
	if res, _ := wrong.httpDo("GET", "/envs", nil, nil); res.StatusCode != 401 {
		t.Fatalf("wrong token: %d", res.StatusCode)
	}
	if res, b := e.httpDo("GET", "/envs", nil, nil); res.StatusCode != 200 {
		t.Fatalf("right token: %d %s", res.StatusCode, b)
	}

	_, err := anon.proc.List(ctx, req(anon, &process.ListRequest{}, ""))
	if connectCode(err) != connect.CodeUnauthenticated {
		t.Fatalf("List without token: %v", err)
	}
	s, err := anon.proc.Start(ctx, req(anon, &process.StartRequest{Process: bashCmd("true")}, ""))
	if err == nil {
		s.Receive()
		err = s.Err()
	}
	if connectCode(err) != connect.CodeUnauthenticated {
		t.Fatalf("Start without token: %v", err)
	}
	if _, err := e.proc.List(ctx, req(e, &process.ListRequest{}, "")); err != nil {
		t.Fatalf("List with token: %v", err)
	}

	// Signed URLs, as the SDK's downloadUrl/uploadUrl make them.
	p := filepath.Join(e.home, "signed.txt")
	must(t, os.WriteFile(p, []byte("signed"), 0o644))
	sign := func(op, user string, exp int64) string {
		raw := p + ":" + op + ":" + user + ":s3cret"
		if exp != 0 {
			raw += ":" + strconv.FormatInt(exp, 10)
		}
		sum := sha256.Sum256([]byte(raw))
		return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	}
	q := url.Values{"path": {p}, "username": {"user"}, "signature": {sign("read", "user", 0)}}
	if res, b := anon.httpDo("GET", "/files?"+q.Encode(), nil, nil); res.StatusCode != 200 || string(b) != "signed" {
		t.Fatalf("signed download: %d %s", res.StatusCode, b)
	}
	q.Set("signature", sign("write", "user", 0))
	if res, _ := anon.httpDo("GET", "/files?"+q.Encode(), nil, nil); res.StatusCode != 401 {
		t.Fatalf("write signature used to read: %d", res.StatusCode)
	}
	past := time.Now().Add(-time.Minute).Unix()
	q.Set("signature", sign("read", "user", past))
	q.Set("signature_expiration", strconv.FormatInt(past, 10))
	if res, _ := anon.httpDo("GET", "/files?"+q.Encode(), nil, nil); res.StatusCode != 401 {
		t.Fatalf("expired signature: %d", res.StatusCode)
	}

	// /init with the token may replace it.
	if res, b := e.httpDo("POST", "/init", strings.NewReader(`{"accessToken":"next"}`), nil); res.StatusCode != 204 {
		t.Fatalf("/init with token: %d %s", res.StatusCode, b)
	}
	if res, _ := e.httpDo("GET", "/envs", nil, nil); res.StatusCode != 401 {
		t.Fatalf("old token still accepted: %d", res.StatusCode)
	}
	e.token = "next"
	if res, _ := e.httpDo("GET", "/envs", nil, nil); res.StatusCode != 200 {
		t.Fatalf("new token refused: %d", res.StatusCode)
	}
}

func TestTokenSetByInit(t *testing.T) {
	e := newEnv(t)
	if res, b := e.httpDo("POST", "/init", strings.NewReader(`{"accessToken":"fromInit"}`), nil); res.StatusCode != 204 {
		t.Fatalf("/init: %d %s", res.StatusCode, b)
	}
	if res, _ := e.httpDo("GET", "/envs", nil, nil); res.StatusCode != 401 {
		t.Fatalf("token from /init not enforced: %d", res.StatusCode)
	}
	// The node hands a sandbox the pool gave a token to a create that
	// asked for none: dropping the token takes the token.
	if res, _ := e.httpDo("POST", "/init", strings.NewReader(`{"dropAccessToken":true}`), nil); res.StatusCode != 401 {
		t.Fatalf("/init dropping the token without it: %d, want 401", res.StatusCode)
	}
	if res, b := e.httpDo("POST", "/init", strings.NewReader(`{"dropAccessToken":true}`), map[string]string{"X-Access-Token": "fromInit"}); res.StatusCode != 204 {
		t.Fatalf("/init dropping the token: %d %s", res.StatusCode, b)
	}
	if res, b := e.httpDo("GET", "/envs", nil, nil); res.StatusCode != 200 {
		t.Fatalf("after the token was dropped: %d %s", res.StatusCode, b)
	}
}

// TestInitOnlyFromOutside: by default /init refuses callers on loopback or
// on the sandbox's own addresses, token or not, and changes nothing.
func TestInitOnlyFromOutside(t *testing.T) {
	e := newEnv(t, func(o *envd.Options) { o.InitFrom = nil })
	res, b := e.httpDo("POST", "/init", strings.NewReader(`{"accessToken":"stolen","defaultUser":"root","envVars":{"LD_PRELOAD":"/x.so"}}`), nil)
	if res.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "platform") {
		t.Fatalf("/init from loopback: %d %s, want 403", res.StatusCode, b)
	}
	// Nothing changed: no token is demanded, LD_PRELOAD is not set.
	res, b = e.httpDo("GET", "/envs", nil, nil)
	if res.StatusCode != 200 || strings.Contains(string(b), "LD_PRELOAD") {
		t.Fatalf("/envs after the refused /init: %d %s", res.StatusCode, b)
	}
}
