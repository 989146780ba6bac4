package build

import (
	"github.com/aenvhq/aenv/internal/buildspec"

	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/runtime/gvisor"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/testutil"
)

func TestParse(t *testing.T) {
	df, err := Parse(strings.NewReader(`# comment
ARG V=1
FROM base AS b
RUN echo a \
  # inside
  && echo b
RUN ["/bin/true", "x"]
ENV A=1 B="two words"
COPY --chown=user:user f.txt /dst/
EXPOSE 80
`))
	if err != nil {
		t.Fatal(err)
	}
	if df.From != "base" || len(df.PreArgs) != 1 || len(df.Steps) != 4 {
		t.Fatalf("parsed %+v", df)
	}
	if s := df.Steps[0]; !s.Shell || s.Args[0] != "echo a   && echo b" || s.Line != 4 {
		t.Fatalf("RUN = %+v", s)
	}
	if s := df.Steps[1]; s.Shell || len(s.Args) != 2 {
		t.Fatalf("exec RUN = %+v", s)
	}
	for _, bad := range []string{"RUN x\n", "FROM a\nFROM b\n", "FROM a\nADD x /y\n", "FROM a\nHEALTHCHECK NONE\n", ""} {
		if _, err := Parse(strings.NewReader(bad)); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
}

func TestWords(t *testing.T) {
	vars := map[string]string{"A": "x", "E": ""}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	cases := map[string][]string{
		`A=1 B="two words"`:    {"A=1", "B=two words"},
		`$A ${A}y '$A' "$A"`:   {"x", "xy", "$A", "x"},
		`${E:-def} ${A:+alt}`:  {"def", "alt"},
		`a\ b c`:               {"a b", "c"},
		`"q\"uote" $ $unknown`: {`q"uote`, "$", ""},
	}
	for in, want := range cases {
		got, err := buildspec.Words(in, lookup)
		if err != nil || strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("buildspec.Words(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestContextSources(t *testing.T) {
	dir := t.TempDir()
	ctx := filepath.Join(dir, "ctx")
	os.MkdirAll(filepath.Join(ctx, "sub"), 0o755)
	os.WriteFile(filepath.Join(ctx, "a.txt"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(dir, "secret"), []byte("s"), 0o644)
	os.Symlink("../secret", filepath.Join(ctx, "link"))
	if got, err := contextSources(ctx, []string{"a.txt", "sub", "/a.txt", "*.txt"}); err != nil || len(got) != 4 || !got[1].dir {
		t.Fatalf("sources = %+v, %v", got, err)
	}
	for _, bad := range []string{"../secret", "sub/../../secret", "link", "missing", "*.nope"} {
		if _, err := contextSources(ctx, []string{bad}); !errors.Is(err, ErrInvalid) {
			t.Errorf("contextSources(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

// testSteps runs steps through a real gVisor driver whose state lives in
// StateDir.
type testSteps struct {
	*gvisor.Driver
	StateDir string
}

// leftovers lists what the driver still holds of finished steps: step
// bundles and runsc containers.
func (h testSteps) leftovers(t *testing.T) []string {
	t.Helper()
	var left []string
	bundles, _ := os.ReadDir(filepath.Join(h.StateDir, "steps-bundles"))
	for _, b := range bundles {
		left = append(left, "bundle "+b.Name())
	}
	containers, _ := os.ReadDir(filepath.Join(h.StateDir, "steps"))
	for _, c := range containers {
		if c.Name() != "null-netns" && c.Name() != "runsc.log" {
			left = append(left, "runsc state "+c.Name())
		}
	}
	return left
}

// testStore is a template store whose base is the prebuilt tree.
func testStore(t *testing.T) (*template.Catalog, testSteps) {
	t.Helper()
	testutil.RequireRoot(t)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	base := os.Getenv("AENV_BASE_ROOTFS")
	if base == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS not set (make base builds it)")
	}
	dir := t.TempDir()
	s, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(dir, "templates"), BaseRootFS: base})
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	d, err := gvisor.New(gvisor.Config{RunscPath: runsc, StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return s, testSteps{Driver: d, StateDir: state}
}

func TestBuild(t *testing.T) {
	store, host := testStore(t)
	ctxDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(ctxDir, "hello.txt"), []byte("hello from the context\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(ctxDir, "tree", "deep"), 0o755)
	os.WriteFile(filepath.Join(ctxDir, "tree", "deep", "f"), []byte("f"), 0o644)
	df, err := Parse(strings.NewReader(`FROM base
ARG GREETING=hi
ARG WHO
ENV APP_HOME=/opt/app MODE="build test"
WORKDIR $APP_HOME
RUN echo "$GREETING $WHO $MODE" > made.txt && id -u > uid-root.txt
COPY --chown=user:user hello.txt ./
COPY tree /opt/tree
COPY tree /etc/
USER user
RUN id -u > /home/user/uid.txt && pwd > /home/user/pwd.txt
`))
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	res, err := Run(context.Background(), df, Options{
		Steps: host, Store: store, ContextDir: ctxDir,
		Template:  template.Template{ID: "built", CPUCount: 1, MemoryMB: 256},
		BuildArgs: map[string]string{"WHO": "world"},
		Log:       &log,
	})
	if err != nil {
		t.Fatalf("build: %v\nlog:\n%s", err, log.String())
	}
	tpl, err := store.Get("built")
	if err != nil {
		t.Fatal(err)
	}
	if res.Template.ID != "built" || tpl.CPUCount != 1 || tpl.MemoryMB != 256 {
		t.Fatalf("template = %+v", tpl)
	}
	img := tpl.Image
	if img == nil || img.WorkingDir != "/opt/app" || img.User != "user" || img.Ref != "base" ||
		!contains(img.Env, "APP_HOME=/opt/app") || !contains(img.Env, "MODE=build test") || contains(img.Env, "GREETING=hi") {
		t.Fatalf("image config = %+v", img)
	}
	root := tpl.RootFS
	check := func(rel, want string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", rel, b, err, want)
		}
	}
	check("opt/app/made.txt", "hi world build test\n")
	check("opt/app/uid-root.txt", "0\n")
	check("home/user/uid.txt", "1000\n")
	check("home/user/pwd.txt", "/opt/app\n")
	check("opt/app/hello.txt", "hello from the context\n")
	check("opt/tree/deep/f", "f")
	check("etc/deep/f", "f")
	if _, err := os.Stat(filepath.Join(root, "etc/passwd")); err != nil {
		t.Errorf("COPY into /etc/ did not merge: %v", err)
	}
	owner := func(rel string) (uint32, uint32, os.FileMode) {
		fi, err := os.Lstat(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return st.Uid, st.Gid, fi.Mode().Perm()
	}
	if u, g, m := owner("opt/app/hello.txt"); u != 1000 || g != 1000 || m != 0o640 {
		t.Errorf("hello.txt owned %d:%d mode %o, want 1000:1000 0640", u, g, m)
	}
	if u, g, _ := owner("opt/tree/deep/f"); u != 0 || g != 0 {
		t.Errorf("tree/deep/f owned %d:%d, want root", u, g)
	}
	if u, _, _ := owner("home/user/uid.txt"); u != 1000 {
		t.Errorf("uid.txt owned by %d, want 1000", u)
	}
	if _, err := os.Lstat(filepath.Join(root, mountDir)); !os.IsNotExist(err) {
		t.Errorf("mount points left in the template: %v", err)
	}
	for _, want := range []string{"Step 1/10 : ARG GREETING=hi", "Step 10/10 : RUN"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
	if left := host.leftovers(t); len(left) != 0 {
		t.Errorf("build state left: %v", left)
	}
}

func TestBuildFailures(t *testing.T) {
	store, host := testStore(t)
	ctxDir := t.TempDir()
	os.WriteFile(filepath.Join(filepath.Dir(ctxDir), "outside"), []byte("secret"), 0o644)
	for _, c := range []struct {
		name, dockerfile string
		code             int
		invalid          bool
	}{
		{"failing-run", "FROM base\nRUN echo before > /f\nRUN echo failing; exit 42\nRUN touch /never\n", 42, false},
		{"escaping-copy", "FROM base\nCOPY ../outside /x\n", -1, true},
		{"unknown-user", "FROM base\nUSER nobody-here\n", -1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			df, err := Parse(strings.NewReader(c.dockerfile))
			if err != nil {
				t.Fatal(err)
			}
			var log bytes.Buffer
			_, err = Run(context.Background(), df, Options{
				Steps: host, Store: store, ContextDir: ctxDir,
				Template: template.Template{ID: c.name}, Log: &log,
			})
			var se *StepError
			if !errors.As(err, &se) {
				t.Fatalf("err = %v, want a StepError\nlog:\n%s", err, log.String())
			}
			if se.ExitCode != c.code || errors.Is(err, ErrInvalid) != c.invalid {
				t.Fatalf("err = %v (code %d)", err, se.ExitCode)
			}
			if c.code > 0 && !strings.Contains(err.Error(), "exited with code 42") {
				t.Fatalf("err = %v", err)
			}
			if _, err := store.Get(c.name); err == nil {
				t.Fatal("a failed build left a template")
			}
			list, _ := store.List()
			if len(list) != 1 {
				t.Fatalf("templates after a failed build: %v", list)
			}
		})
	}
	if left := host.leftovers(t); len(left) != 0 {
		t.Errorf("build state left: %v", left)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestBuildCancelled(t *testing.T) {
	store, host := testStore(t)
	df, err := Parse(strings.NewReader("FROM base\nRUN echo started; sleep 60\n"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw, _ := os.Pipe()
	defer pr.Close()
	go func() {
		// Cancel once the step's command runs.
		buf := make([]byte, 4096)
		var seen strings.Builder
		for {
			n, err := pr.Read(buf)
			seen.Write(buf[:n])
			if strings.Contains(seen.String(), "started") {
				cancel()
			}
			if err != nil {
				return
			}
		}
	}()
	start := time.Now()
	_, err = Run(ctx, df, Options{Steps: host, Store: store, Template: template.Template{ID: "cancelled"}, Log: pw})
	pw.Close()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if time.Since(start) > 45*time.Second {
		t.Fatalf("cancelling took %s", time.Since(start))
	}
	if _, err := store.Get("cancelled"); err == nil {
		t.Fatal("a cancelled build left a template")
	}
	if left := host.leftovers(t); len(left) != 0 {
		t.Errorf("build state left: %v", left)
	}
	if out, _ := exec.Command("pgrep", "-f", host.StateDir).Output(); len(out) > 0 {
		t.Errorf("build processes left: %s", out)
	}
}
