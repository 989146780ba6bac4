package template

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func stagedTemplate(t *testing.T, s *Catalog, id, marker string) *Stage {
	t.Helper()
	st, err := s.NewStage(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(st.RootFS(), "marker"), []byte(marker), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(st.ScratchDir(), "download"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	return st
}

func readMarker(t *testing.T, s *Catalog, id string) string {
	t.Helper()
	tpl, err := s.Get(id)
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	b, err := os.ReadFile(filepath.Join(tpl.RootFS, "marker"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// stageDirs lists what is left of stages in the store's directory.
func stageDirs(t *testing.T, s *Catalog) []string {
	t.Helper()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), stagePrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestStageCommitAndReplace(t *testing.T) {
	s, err := NewCatalog(CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	st := stagedTemplate(t, s, "img", "one")
	if _, err := s.Get("img"); err == nil {
		t.Fatal("a staged template is visible before Commit")
	}
	img := &ImageConfig{Ref: "docker://x:1", Env: []string{"A=1"}, WorkingDir: "/w"}
	if err := st.Commit(&Template{ID: "img", CPUCount: 1, MemoryMB: 128, StartCmd: "serve", Image: img}); err != nil {
		t.Fatal(err)
	}
	if got := readMarker(t, s, "img"); got != "one" {
		t.Fatalf("marker = %q", got)
	}
	tpl, _ := s.Get("img")
	if tpl.StartCmd != "serve" || tpl.Image == nil || tpl.Image.WorkingDir != "/w" || tpl.Image.Env[0] != "A=1" || tpl.CreatedAt.IsZero() {
		t.Fatalf("metadata = %+v image %+v", tpl, tpl.Image)
	}
	if _, err := os.Stat(filepath.Join(s.dir, "img", "scratch")); !os.IsNotExist(err) {
		t.Fatalf("scratch dir published: %v", err)
	}
	if err := st.Abort(); err != nil {
		t.Fatalf("Abort after Commit: %v", err)
	}

	// A second stage of the same id: the old template stays until Commit.
	st2 := stagedTemplate(t, s, "img", "two")
	if got := readMarker(t, s, "img"); got != "one" {
		t.Fatalf("old template changed before Commit: %q", got)
	}
	if err := st2.Commit(&Template{ID: "img"}); err != nil {
		t.Fatal(err)
	}
	if got := readMarker(t, s, "img"); got != "two" {
		t.Fatalf("marker after replace = %q", got)
	}
	if left := stageDirs(t, s); len(left) != 0 {
		t.Fatalf("stage directories left: %v", left)
	}

	// An aborted stage leaves the template and no trace.
	st3 := stagedTemplate(t, s, "img", "three")
	if err := st3.Abort(); err != nil {
		t.Fatal(err)
	}
	if got := readMarker(t, s, "img"); got != "two" {
		t.Fatalf("marker after abort = %q", got)
	}
	if left := stageDirs(t, s); len(left) != 0 {
		t.Fatalf("stage directories left: %v", left)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].ID != "img" {
		t.Fatalf("List = %v, %v", list, err)
	}
}

func TestStageRefusals(t *testing.T) {
	s, err := NewCatalog(CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "../x", "Upper", ".stage-x", "a/b"} {
		if _, err := s.NewStage(bad); err == nil {
			t.Errorf("NewStage(%q) succeeded", bad)
		}
	}
	st, err := s.NewStage("a")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Abort()
	if err := st.Commit(&Template{ID: "b"}); err == nil {
		t.Fatal("Commit under another id succeeded")
	}
}

func TestAbandonedStagesAreSwept(t *testing.T) {
	s, err := NewCatalog(CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	// A stage whose process died: nobody holds its lock.
	dead := filepath.Join(s.dir, stagePrefix+"x-dead")
	if err := os.MkdirAll(filepath.Join(dead, "rootfs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	live, err := s.NewStage("y")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Abort()
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Fatalf("abandoned stage not removed: %v", err)
	}
	other, err := s.NewStage("z")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Abort()
	if _, err := os.Stat(live.RootFS()); err != nil {
		t.Fatalf("a live stage was removed: %v", err)
	}
}

// TestConcurrentStages: stages made at once (two teams' builds) all
// survive; a stage was briefly unlocked after its mkdir, and another
// NewStage's sweep removed it as abandoned.
func TestConcurrentStages(t *testing.T) {
	s, err := NewCatalog(CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			st, err := s.NewStage(fmt.Sprintf("t%d", i%7))
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := os.Stat(st.RootFS()); err != nil {
				t.Errorf("a stage's tree went while it was held: %v", err)
			}
			st.Abort()
		})
	}
	wg.Wait()
}
