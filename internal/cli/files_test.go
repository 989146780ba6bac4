package cli

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/aenvhq/aenv/internal/client"
)

func TestUploadDownload(t *testing.T) {
	e := startServer(t)
	id := e.create(t, "base")
	dir := t.TempDir()

	data := make([]byte, 10<<20)
	if _, err := io.ReadFull(rand.Reader, data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	local := filepath.Join(dir, "random.bin")
	if err := os.WriteFile(local, data, 0o600); err != nil {
		t.Fatal(err)
	}

	e.mustRun(t, "upload", id, local, "/home/user/deep/er/random.bin")
	out := e.mustRun(t, "exec", id, "--", "sha256sum /home/user/deep/er/random.bin; stat -c %U /home/user/deep/er/random.bin")
	if !strings.HasPrefix(out, want+" ") || !strings.HasSuffix(out, "\nuser\n") {
		t.Fatalf("in the sandbox: %q, want sha256 %s owned by user", out, want)
	}

	back := filepath.Join(dir, "back.bin")
	e.mustRun(t, "download", id, "/home/user/deep/er/random.bin", back)
	got, err := os.ReadFile(back)
	if err != nil {
		t.Fatal(err)
	}
	if s := sha256.Sum256(got); hex.EncodeToString(s[:]) != want {
		t.Fatalf("downloaded %d bytes with another sha256 than the %d uploaded", len(got), len(data))
	}

	// A directory as LOCAL receives REMOTE's name; a REMOTE ending in /
	// receives LOCAL's.
	e.mustRun(t, "upload", id, local, "/tmp/")
	e.mustRun(t, "download", id, "/tmp/random.bin", dir+"/")
	if b, err := os.ReadFile(filepath.Join(dir, "random.bin")); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("round trip through /tmp/: %v", err)
	}

	// '-' is stdin and stdout; relative paths start at the user's home.
	r := e.run(t, "from stdin\n", "upload", id, "-", "rel.txt")
	if r.code != 0 {
		t.Fatalf("upload from stdin: exit %d, stderr %q", r.code, r.stderr)
	}
	if out := e.mustRun(t, "download", id, "/home/user/rel.txt", "-"); out != "from stdin\n" {
		t.Fatalf("download to stdout: %q", out)
	}

	// An empty file is a file too.
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e.mustRun(t, "upload", id, empty, "/tmp/empty")
	if out := e.mustRun(t, "exec", id, "--", "stat -c %s /tmp/empty"); out != "0\n" {
		t.Fatalf("empty upload: size %q", out)
	}

	// Failures: nothing is left behind locally.
	r = e.run(t, "", "download", id, "/no/such/file", filepath.Join(dir, "missing"))
	oneErrorLine(t, r, "/no/such/file")
	if _, err := os.Stat(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Fatalf("a failed download left %s: %v", filepath.Join(dir, "missing"), err)
	}
	entries, _ := os.ReadDir(dir)
	for _, en := range entries {
		if strings.HasPrefix(en.Name(), ".") {
			t.Fatalf("a temporary file was left behind: %s", en.Name())
		}
	}
	oneErrorLine(t, e.run(t, "", "upload", id, filepath.Join(dir, "nope"), "/tmp/x"), "no such file")
	oneErrorLine(t, e.run(t, "", "upload", id, dir, "/tmp/x"), "is a directory")
	oneErrorLine(t, e.run(t, "", "download", id, "/tmp", filepath.Join(dir, "x")), "directory")
}

// TestSecureSandbox: with --secure, envd wants the sandbox's access token;
// exec, upload, download and connect find it and pass it on.
func TestSecureSandbox(t *testing.T) {
	e := startServer(t)
	id := e.create(t, "base", "--secure")
	sb, err := e.c.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.EnvdAccessToken == "" {
		t.Fatal("a --secure sandbox has no envd access token")
	}
	// Without the token envd refuses: the token is really checked.
	if _, err := client.New(e.url, e.key).Run(t.Context(), id, "true", client.RunOptions{}); err == nil {
		t.Fatal("a command without the access token ran")
	}

	if out := e.mustRun(t, "exec", id, "--", "echo secure"); out != "secure\n" {
		t.Fatalf("exec: %q", out)
	}
	if r := e.run(t, "payload", "upload", id, "-", "/tmp/p"); r.code != 0 {
		t.Fatalf("upload: exit %d, stderr %q", r.code, r.stderr)
	}
	if out := e.mustRun(t, "download", id, "/tmp/p", "-"); out != "payload" {
		t.Fatalf("download: %q", out)
	}
	if r := e.run(t, "cat /tmp/p\n", "connect", id); r.code != 0 || r.stdout != "payload" {
		t.Fatalf("connect: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestTransferProgress: on a terminal, a big transfer shows its progress
// on stderr and ends it with the total.
func TestTransferProgress(t *testing.T) {
	e := startServer(t)
	id := e.create(t, "base")
	local := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(local, bytes.Repeat([]byte("0123456789abcdef"), 256<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	tm := startTerminal(t, &pty.Winsize{Rows: 24, Cols: 120}, "upload", id, local, "/tmp/big", "--url", e.url, "--key-file", e.keyFile)
	tm.expect(`Uploading 4\.0 MiB / 4\.0 MiB 100%`, 60*time.Second)
	if err := tm.cmd.Wait(); err != nil {
		t.Fatalf("upload on a terminal: %v; output %q", err, tm.out.String())
	}
	tm = startTerminal(t, &pty.Winsize{Rows: 24, Cols: 120}, "download", id, "/tmp/big", local+".back", "--url", e.url, "--key-file", e.keyFile)
	tm.expect(`Downloading 4\.0 MiB / 4\.0 MiB 100%`, 60*time.Second)
	if err := tm.cmd.Wait(); err != nil {
		t.Fatalf("download on a terminal: %v; output %q", err, tm.out.String())
	}
}
