package cli

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestSecretFlagsRefused: a long-lived secret on the command line is
// refused before anything runs, and the error names the way to give it.
func TestSecretFlagsRefused(t *testing.T) {
	isolateConfig(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ls", "--key", "e2b_0123"}, "--key-file FILE or $AENV_API_KEY"},
		{[]string{"--key=e2b_0123", "create", "base"}, "--key-file FILE or $AENV_API_KEY"},
		{[]string{"auth", "--url", "http://127.0.0.1:1", "--key", "e2b_0123"}, "--key-file"},
		{[]string{"server", "--cluster-token", "aenvct_0123456789abcdef"}, "--cluster-token-file FILE or $AENV_CLUSTER_TOKEN"},
		{[]string{"server", "--store-secret-key", "s3cr3t"}, "--store-secret-key-file FILE or $AWS_SECRET_ACCESS_KEY"},
		{[]string{"node", "--store-secret-key", "s3cr3t"}, "--store-secret-key-file"},
		// The cluster token, with the old join or none: refused.
		{[]string{"node", "--join", "http://10.0.0.1:8000", "--token", "aenvct_0123456789abcdef"}, "--token-file FILE or $AENV_CLUSTER_TOKEN"},
		{[]string{"node", "--etcd-endpoints", "https://10.0.0.1:2379", "--token", "aenvct_0123456789abcdef"}, "--token-file"},
	} {
		code, err := RunWith(context.Background(), c.args, Options{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard})
		if code == 0 || err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "command line") {
			t.Errorf("aenv %s: exit %d, error %v; want one naming %q", strings.Join(c.args, " "), code, err, c.want)
		}
	}
	// The flags stay out of the help, which shows the file flags instead.
	var help strings.Builder
	if _, err := RunWith(context.Background(), []string{"server", "--help"}, Options{Stdin: strings.NewReader(""), Stdout: &help, Stderr: io.Discard}); err != nil {
		t.Fatal(err)
	}
	if h := help.String(); strings.Contains(h, "--cluster-token ") || strings.Contains(h, "--store-secret-key ") || !strings.Contains(h, "--cluster-token-file") {
		t.Errorf("server --help shows a refused secret flag, or not the file flag:\n%s", h)
	}
}
