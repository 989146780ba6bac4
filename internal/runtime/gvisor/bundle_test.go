package gvisor

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/testutil"
)

// TestBundleMarksPrestarted: the spec of a sandbox booted for the warm
// pool carries PrestartedAnnotation and the lowest CPU shares, with a
// gofer or without one (where the root's annotations are written too),
// and no other spec does.
func TestBundleMarksPrestarted(t *testing.T) {
	mkfs := testutil.RequireBinary(t, "mkfs.erofs", "")
	img := filepath.Join(t.TempDir(), "root.erofs")
	if out, err := exec.Command(mkfs, "--quiet", "-Enoinline_data", img, t.TempDir()).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v: %s", err, out)
	}
	for _, tc := range []struct {
		name       string
		tools      string
		prestarted bool
	}{
		{"with a gofer, prestarted", "", true},
		{"with a gofer", "", false},
		{"without a gofer, prestarted", "/images/tools.erofs", true},
		{"without a gofer", "/images/tools.erofs", false},
	} {
		dir := t.TempDir()
		spec := runtime.Spec{ID: "sb", Hostname: "sb", EnvdPath: "/bin/envd", EnvdPort: 49983, CPUCount: 1, MemoryMB: 256,
			Root: runtime.RootFS{Dir: t.TempDir(), Image: img}, Prestarted: tc.prestarted}
		if err := writeBundle(dir, spec, "/aenv/sb", tc.tools); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var s specs.Spec
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got, want := s.Annotations[PrestartedAnnotation] == "true", tc.prestarted; got != want {
			t.Errorf("%s: marked prestarted %v, want %v (annotations %v)", tc.name, got, want, s.Annotations)
		}
		if _, ok := s.Annotations[rootfsSourceAnnotation]; ok != (tc.tools != "") {
			t.Errorf("%s: the root's annotations %v lost or added", tc.name, s.Annotations)
		}
		// Prestarted, it boots at the lowest CPU weight, beside its quota.
		cpu := s.Linux.Resources.CPU
		if cpu == nil || cpu.Quota == nil || *cpu.Quota != 100000 {
			t.Errorf("%s: CPU resources %+v lost the quota of 1 CPU", tc.name, cpu)
		} else if got := cpu.Shares != nil && *cpu.Shares == 2; got != tc.prestarted {
			t.Errorf("%s: CPU shares %v, want the lowest (2) only when prestarted", tc.name, cpu.Shares)
		}
	}
}
