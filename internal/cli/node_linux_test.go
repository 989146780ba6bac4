package cli

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNodeTokenFileGone: with an https --join, a missing --token-file is
// an error for a node that never joined, and no error for one holding a
// certificate from an earlier join (which goes on to use it: here a
// broken one, whose error is the proof). scripts/install.sh --node
// removes the token's file after the join and relies on this.
func TestNodeTokenFileGone(t *testing.T) {
	isolateConfig(t)
	data := t.TempDir()
	missing := filepath.Join(t.TempDir(), "join-token")
	args := []string{"node", "--join", "https://127.0.0.1:1", "--ca-hash", "sha256:" + strings.Repeat("0", 64),
		"--token-file", missing, "--data-dir", data, "--run-dir", t.TempDir()}
	run := func() error {
		_, err := RunWith(context.Background(), args, Options{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard})
		return err
	}
	if err := run(); err == nil || !strings.Contains(err.Error(), "--token-file") || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("a node that never joined, without its token file: %v; want the file's error", err)
	}

	secrets := filepath.Join(data, "secrets")
	if err := os.MkdirAll(secrets, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"node.crt", "node.key", "ca.crt"} {
		if err := os.WriteFile(filepath.Join(secrets, f), []byte("not PEM\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	err := run()
	if err == nil || strings.Contains(err.Error(), "--token-file") || !strings.Contains(err.Error(), secrets) {
		t.Fatalf("a node with a certificate, without its token file: %v; want it to read its certificate in %s (and fail on the broken one)", err, secrets)
	}
}
