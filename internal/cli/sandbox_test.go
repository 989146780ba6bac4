package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

func TestListAndRemove(t *testing.T) {
	e := startServer(t)
	tag := fmt.Sprintf("t%d", time.Now().UnixNano())
	ids := []string{
		e.create(t, "base", "--metadata", "suite="+tag, "--metadata", "n=1"),
		e.create(t, "base", "--metadata", "suite="+tag, "--metadata", "n=2"),
		e.create(t, "base", "--metadata", "suite="+tag),
	}

	var listed []client.Sandbox
	if err := json.Unmarshal([]byte(e.mustRun(t, "ls", "-o", "json")), &listed); err != nil {
		t.Fatalf("ls -o json is not JSON: %v", err)
	}
	for _, id := range ids {
		if !slices.ContainsFunc(listed, func(sb client.Sandbox) bool { return sb.SandboxID == id && sb.State == "running" }) {
			t.Fatalf("ls -o json lacks running sandbox %s: %+v", id, listed)
		}
	}

	table := e.mustRun(t, "ls")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[0], "METADATA") {
		t.Fatalf("ls table has no header: %q", table)
	}
	for _, id := range ids {
		if !strings.Contains(table, id+" ") {
			t.Fatalf("ls table lacks %s:\n%s", id, table)
		}
	}
	if !strings.Contains(table, "n=1,suite="+tag) {
		t.Fatalf("ls table does not show metadata:\n%s", table)
	}

	filtered := func(args ...string) []string {
		var list []client.Sandbox
		out := e.mustRun(t, append([]string{"ls", "-o", "json"}, args...)...)
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("ls %v: %v", args, err)
		}
		var got []string
		for _, sb := range list {
			got = append(got, sb.SandboxID)
		}
		slices.Sort(got)
		return got
	}
	want := slices.Sorted(slices.Values(ids))
	if got := filtered("--metadata", "suite="+tag); !slices.Equal(got, want) {
		t.Fatalf("ls --metadata suite=%s: %v, want %v", tag, got, want)
	}
	if got := filtered("--metadata", "suite="+tag, "--metadata", "n=2"); !slices.Equal(got, []string{ids[1]}) {
		t.Fatalf("ls with two metadata pairs: %v, want [%s]", got, ids[1])
	}
	if got := filtered("--metadata", "suite="+tag, "--state", "paused"); len(got) != 0 {
		t.Fatalf("ls --state paused: %v, want none", got)
	}
	if got := filtered("--metadata", "suite="+tag, "--state", "running,paused"); !slices.Equal(got, want) {
		t.Fatalf("ls --state running,paused: %v, want %v", got, want)
	}
	if got := filtered("--metadata", "suite=nothing-has-this"); len(got) != 0 {
		t.Fatalf("ls with an unmatched filter: %v", got)
	}

	// Several at once.
	if out := e.mustRun(t, "rm", ids[0], ids[1]); out != ids[0]+"\n"+ids[1]+"\n" {
		t.Fatalf("rm printed %q", out)
	}
	for _, id := range ids[:2] {
		if e.exists(t, id) {
			t.Fatalf("rm left %s", id)
		}
	}
	// A mix with an unknown id: the known one goes, the exit status says
	// something failed, and the error names the unknown one.
	r := e.run(t, "", "rm", "nosuchsandbox", ids[2])
	if r.code == 0 {
		t.Fatal("rm with an unknown id exited 0")
	}
	oneErrorLine(t, r, "nosuchsandbox")
	if r.stdout != ids[2]+"\n" {
		t.Fatalf("rm printed %q, want %q", r.stdout, ids[2]+"\n")
	}
	if e.exists(t, ids[2]) {
		t.Fatalf("rm with an unknown id left %s", ids[2])
	}
}

func TestTimeoutCommand(t *testing.T) {
	e := startServer(t)
	id := e.create(t, "base", "--timeout", "600")
	e.mustRun(t, "timeout", id, "300")
	sb, err := e.c.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(sb.EndAt); left < 250*time.Second || left > 310*time.Second {
		t.Fatalf("after 'timeout %s 300' the sandbox ends in %s", id, left)
	}
	e.mustRun(t, "timeout", id, "1")
	deadline := time.Now().Add(15 * time.Second)
	for e.exists(t, id) {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still exists 15s after 'timeout %s 1'", id, id)
		}
		time.Sleep(200 * time.Millisecond)
	}
	oneErrorLine(t, e.run(t, "", "timeout", id, "10"), "not found")
}

func TestPauseResume(t *testing.T) {
	e := startServer(t)
	id := e.create(t, "base")
	// A server that cannot pause says so, and the CLI shows what it says.
	r := e.run(t, "", "pause", id)
	if r.code == 0 {
		if out := strings.TrimSpace(r.stdout); out != id {
			t.Fatalf("pause printed %q", out)
		}
		var paused []client.Sandbox
		if err := json.Unmarshal([]byte(e.mustRun(t, "ls", "--state", "paused", "-o", "json")), &paused); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(paused, func(sb client.Sandbox) bool { return sb.SandboxID == id }) {
			t.Fatalf("ls --state paused lacks the paused %s: %+v", id, paused)
		}
		// connect resumes a paused sandbox before opening the shell.
		r := e.run(t, "echo back\n", "connect", id)
		if r.code != 0 || r.stdout != "back\n" || !strings.Contains(r.stderr, "Resumed sandbox "+id) {
			t.Fatalf("connect to a paused sandbox: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
		}
		e.mustRun(t, "pause", id)
		r = e.run(t, "", "resume", id)
		if r.code != 0 || strings.TrimSpace(r.stdout) != id || r.stderr != "" {
			t.Fatalf("resume: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
		}
		if out := e.mustRun(t, "exec", id, "--", "echo alive"); out != "alive\n" {
			t.Fatalf("after resume: %q", out)
		}
	} else {
		oneErrorLine(t, r, "pausing sandbox "+id)
		if !strings.Contains(r.stderr, "not supported") {
			t.Fatalf("pause error does not pass the server's reason on: %q", r.stderr)
		}
	}
	// Resuming a running sandbox leaves it running.
	r = e.run(t, "", "resume", id)
	if r.code != 0 || strings.TrimSpace(r.stdout) != id {
		t.Fatalf("resume of a running sandbox: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	if !e.exists(t, id) {
		t.Fatal("resume killed the sandbox")
	}
	oneErrorLine(t, e.run(t, "", "resume", "nosuchsandbox"), "not found")
	oneErrorLine(t, e.run(t, "", "pause", "nosuchsandbox"), "not found")
}

func TestTemplates(t *testing.T) {
	e := startServer(t)
	var list []client.Template
	if err := json.Unmarshal([]byte(e.mustRun(t, "template", "ls", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(list, func(tp client.Template) bool { return tp.TemplateID == "base" }) {
		t.Fatalf("template ls lacks base: %+v", list)
	}
	table := e.mustRun(t, "template", "ls")
	if !strings.HasPrefix(table, "ID ") || !strings.Contains(table, "\nbase ") {
		t.Fatalf("template ls table:\n%s", table)
	}
	// Removing an unknown template fails with the server's reason.
	oneErrorLine(t, e.run(t, "", "template", "rm", "nosuchtemplate"), "deleting template nosuchtemplate")
}

func TestVersionAndCompletion(t *testing.T) {
	r := (*testEnv)(nil).run(t, "", "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "aenv ") {
		t.Fatalf("version: exit %d stdout %q", r.code, r.stdout)
	}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		r := (*testEnv)(nil).run(t, "", "completion", sh)
		if r.code != 0 || !strings.Contains(r.stdout, "aenv") || len(r.stdout) < 500 {
			t.Fatalf("completion %s: exit %d, %d bytes", sh, r.code, len(r.stdout))
		}
	}
}
