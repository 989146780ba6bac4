package gvisor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/testutil"
)

// TestRunscSeccompPrecompiled: the runsc that scripts/install-deps.sh
// builds carries its seccomp programs precompiled (scripts/runsc-seccomp),
// so a sandbox's sentry and gofer load theirs rather than compile them at
// every start and restore (~50 ms of CPU each). A sandbox with no network
// has the option set of aenv's (--network=sandbox is netstack too), on
// aenv's platform.
func TestRunscSeccompPrecompiled(t *testing.T) {
	testutil.RequireRoot(t)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	dir := t.TempDir()
	logs := filepath.Join(dir, "logs") + "/"
	if err := os.Mkdir(logs, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(runsc, "--root="+filepath.Join(dir, "root"), "--platform=systrap", "--network=none",
		"--cpu-num-from-quota", "--allow-suid", "--debug", "--debug-log="+logs, "do", "/bin/true")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("runsc do /bin/true: %v\n%s", err, out)
	}
	files, err := filepath.Glob(logs + "*")
	if err != nil || len(files) == 0 {
		t.Fatalf("runsc wrote no debug log (%v)", err)
	}
	loaded := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "No precompiled program found") {
				t.Errorf("%s: %s", filepath.Base(f), line)
			}
		}
		loaded += strings.Count(string(b), "Loaded precompiled seccomp instructions")
	}
	// One for the sentry, one for the gofer.
	if loaded != 2 {
		t.Errorf("%d precompiled seccomp programs loaded, want 2 (the sentry's and the gofer's): is %s built by scripts/install-deps.sh?", loaded, runsc)
	}
}

// TestRunscVersion checks that the runsc install-deps.sh built names its
// gVisor version: snapshots record it, and a build without one would let
// any runsc restore any other's images.
func TestRunscVersion(t *testing.T) {
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	d := &Driver{cfg: Config{RunscPath: runsc}}
	v := d.Version(context.Background())
	if v == "" || v == "unknown" || strings.Contains(v, "VERSION_MISSING") {
		t.Fatalf("runsc --version says %q: build it with -X gvisor.dev/gvisor/runsc/version.version (scripts/install-deps.sh)", v)
	}
}
