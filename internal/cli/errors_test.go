package cli

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestBadInput: every mistake a user can make gives one clear line on
// stderr and a non-zero exit, never a stack or a usage dump.
func TestBadInput(t *testing.T) {
	e := startServer(t)
	isolateConfig(t)
	id := e.create(t, "base")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown sandbox for exec", []string{"exec", "nosuchsandbox", "--", "true"}, "sandbox not found"},
		{"unknown sandbox for connect", []string{"connect", "nosuchsandbox"}, "not found"},
		{"unknown sandbox for upload", []string{"upload", "nosuchsandbox", "-", "/tmp/x"}, "not found"},
		{"unknown sandbox for download", []string{"download", "nosuchsandbox", "/etc/hostname", "-"}, "not found"},
		{"unknown sandbox for rm", []string{"rm", "nosuchsandbox"}, "nosuchsandbox"},
		{"invalid sandbox id", []string{"exec", "NOT-AN-ID", "--", "true"}, "invalid sandbox id"},
		{"unknown template for create", []string{"create", "nosuchtemplate"}, "template"},
		{"unknown template for start", []string{"start", "nosuchtemplate"}, "template"},
		{"missing id", []string{"rm"}, "missing ID"},
		{"missing command", []string{"exec", id}, "missing COMMAND"},
		{"missing template", []string{"start"}, "missing TEMPLATE"},
		{"missing upload args", []string{"upload", id}, "missing LOCAL and REMOTE"},
		{"extra args", []string{"timeout", id, "10", "20"}, "unexpected argument"},
		{"bad seconds", []string{"timeout", id, "soon"}, "SECONDS must be"},
		{"bad --output", []string{"ls", "-o", "yaml"}, `unknown --output "yaml"`},
		{"bad template --output", []string{"template", "ls", "--output", "xml"}, "unknown --output"},
		{"bad --metadata", []string{"ls", "--metadata", "novalue"}, "want KEY=VALUE"},
		{"bad --state", []string{"ls", "--state", "sleeping"}, "unknown --state"},
		{"bad --env", []string{"exec", "--env", "=x", id, "--", "true"}, "want KEY=VALUE"},
		{"bad flag value", []string{"exec", "--timeout", "abc", id, "--", "true"}, "invalid argument"},
		{"bad --timeout", []string{"create", "--timeout", "0"}, "--timeout must be"},
		{"unknown flag", []string{"ls", "--bogus"}, "unknown flag: --bogus"},
		{"unknown command", []string{"strat"}, "did you mean start"},
		{"unknown subcommand", []string{"template", "lss"}, "did you mean ls"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			oneErrorLine(t, e.run(t, "", tc.args...), tc.want)
		})
	}
	t.Run("wrong key", func(t *testing.T) {
		r := withKey(t, e.url, "e2b_0000wrong").run(t, "", "ls")
		oneErrorLine(t, r, "401")
	})
	t.Run("no server", func(t *testing.T) {
		r := withKey(t, "http://127.0.0.1:1", "k").run(t, "", "ls")
		oneErrorLine(t, r, "cannot reach the server at http://127.0.0.1:1")
	})
	// The real binary prints the same single line and exits non-zero.
	t.Run("binary", func(t *testing.T) {
		cmd := exec.Command(aenvBinary(t), "--url", e.url, "--key-file", e.keyFile, "exec", "nosuchsandbox", "--", "true")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("exit: %v", err)
		}
		oneErrorLine(t, result{code: 1, stderr: stderr.String()}, "sandbox not found")
	})
}
