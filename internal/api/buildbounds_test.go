package api_test

import (
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/server"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/testutil"
)

// tinyTemplate publishes "tiny", a busybox tree, in the store of the
// server whose data directory is data: builds from it start in no time.
func tinyTemplate(t *testing.T, data string) {
	t.Helper()
	busybox := testutil.RequireBinary(t, "busybox", "")
	store, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(data, "templates")})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.NewStage("tiny")
	if err != nil {
		t.Fatal(err)
	}
	root := st.RootFS()
	for _, d := range []string{"bin", "etc", "home/user", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "mkdir", "dd", "head", "tail", "sleep", "echo", "id", "cat"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nuser:x:1000:\n"), 0o644)
	os.Chown(filepath.Join(root, "home/user"), 1000, 1000)
	if err := st.Commit(&template.Template{ID: "tiny", CPUCount: 1, MemoryMB: 256, Image: &template.ImageConfig{Env: []string{"PATH=/bin"}}}); err != nil {
		t.Fatal(err)
	}
}

// allocated is the disk space the files under dir take.
func allocated(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil {
			if fi, err := d.Info(); err == nil {
				n += fi.Sys().(*syscall.Stat_t).Blocks * 512
			}
		}
		return nil
	})
	return n
}

// timedStatus is a build's status with its log's times.
type timedStatus struct {
	Status     string `json:"status"`
	LogEntries []struct {
		Timestamp time.Time `json:"timestamp"`
		Message   string    `json:"message"`
	} `json:"logEntries"`
	Reason *struct {
		Message string `json:"message"`
	} `json:"reason"`
}

// TestBuildBoundsAPI runs E2B builds past each of the server's build
// bounds and checks that each fails with its reason in the log, and that
// builds past --max-builds wait their turn.
func TestBuildBoundsAPI(t *testing.T) {
	url, key, data := startServerWith(t, func(c *server.Config) {
		c.BuildDiskBytes = 64 << 20
		c.BuildMemoryMB = 256
		c.BuildTimeout = 8 * time.Second
		c.MaxBuilds = 2
	})
	tinyTemplate(t, data)
	start := func(t *testing.T, name, run string) string {
		t.Helper()
		var req struct{ BuildID string }
		if code := call(t, url, key, "POST", "/v3/templates", map[string]any{"name": name}, &req); code != http.StatusAccepted {
			t.Fatalf("requesting build %s: %d", name, code)
		}
		body := map[string]any{"fromTemplate": "tiny", "steps": []map[string]any{{"type": "RUN", "args": []string{run, "root"}}}}
		if code := call(t, url, key, "POST", "/v2/templates/"+name+"/builds/"+req.BuildID, body, nil); code != http.StatusAccepted {
			t.Fatalf("starting build %s: %d", name, code)
		}
		return req.BuildID
	}
	wait := func(t *testing.T, name, buildID string) timedStatus {
		t.Helper()
		for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			var st timedStatus
			call(t, url, key, "GET", "/templates/"+name+"/builds/"+buildID+"/status", nil, &st)
			if st.Status == "ready" || st.Status == "error" {
				return st
			}
		}
		t.Fatalf("build %s did not end", name)
		return timedStatus{}
	}
	failsWith := func(t *testing.T, name, run, reason string) {
		t.Helper()
		st := wait(t, name, start(t, name, run))
		last := st.LogEntries[len(st.LogEntries)-1].Message
		if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, reason) || !strings.Contains(last, reason) {
			t.Fatalf("build %s: %s, reason %+v, last log line %q; want %q", name, st.Status, st.Reason, last, reason)
		}
	}

	t.Run("disk", func(t *testing.T) {
		before := allocated(data)
		// count bounds the harm should the bound not hold.
		failsWith(t, "fills-disk", "dd if=/dev/zero of=/f bs=1M count=512", "no space left on the build disk (64 MiB)")
		if grew := allocated(data) - before; grew > 8<<20 {
			t.Fatalf("the data directory grew by %d MiB", grew>>20)
		}
	})
	t.Run("memory", func(t *testing.T) {
		// dd's buffer is the hog: it fills at once, where a pipe into
		// tail takes seconds on a loaded host.
		failsWith(t, "eats-memory", "dd if=/dev/zero of=/dev/null bs=1G count=1", "killed: out of memory (256 MiB)")
	})
	t.Run("timeout", func(t *testing.T) {
		began := time.Now()
		failsWith(t, "sleeps", "sleep 60", "timed out after 8s")
		if took := time.Since(began); took > 30*time.Second {
			t.Fatalf("an 8s time limit took %s", took)
		}
	})
	t.Run("queue", func(t *testing.T) {
		ids := map[string]string{}
		for i := range 5 {
			name := fmt.Sprintf("queued-%d", i)
			ids[name] = start(t, name, "echo began; sleep 1; echo ended")
		}
		type span struct{ from, to time.Time }
		var spans []span
		var mu sync.Mutex
		queued := 0
		var wg sync.WaitGroup
		for name, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st := wait(t, name, id)
				var s span
				for _, e := range st.LogEntries {
					switch {
					case strings.HasPrefix(e.Message, "queued: "):
						mu.Lock()
						queued++
						mu.Unlock()
					case e.Message == "began":
						s.from = e.Timestamp
					case e.Message == "ended":
						s.to = e.Timestamp
					}
				}
				if st.Status != "ready" || s.from.IsZero() || s.to.IsZero() {
					t.Errorf("build %s: %s %+v", name, st.Status, st.Reason)
				}
				mu.Lock()
				spans = append(spans, s)
				mu.Unlock()
			}()
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		// At most two ran at any one time, and two did.
		most := 0
		sort.Slice(spans, func(i, j int) bool { return spans[i].from.Before(spans[j].from) })
		for _, s := range spans {
			n := 0
			for _, o := range spans {
				if !o.from.After(s.from) && o.to.After(s.from) {
					n++
				}
			}
			most = max(most, n)
		}
		if most != 2 || queued != 3 {
			t.Fatalf("%d builds ran at once (want 2), %d were queued (want 3): %v", most, queued, spans)
		}
	})
}
