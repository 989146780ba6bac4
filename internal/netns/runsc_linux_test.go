package netns

import (
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestRunscInSlot runs real gVisor sandboxes in a slot: runsc takes eth0's
// address, the host reaches the sandbox through HostAddr, and after Recycle
// the same namespace serves a second sandbox.
func TestRunscInSlot(t *testing.T) {
	testutil.RequireRoot(t)
	runsc := os.Getenv("AENV_RUNSC")
	if runsc == "" {
		if p, err := exec.LookPath("runsc"); err == nil {
			runsc = p
		} else if _, err := os.Stat("/var/cache/aenv/bin/runsc"); err == nil {
			runsc = "/var/cache/aenv/bin/runsc" // where HOST-NOTES caches it
		}
	}
	if runsc == "" {
		testutil.Unavailable(t, "runsc not found (set AENV_RUNSC)")
	}
	busybox := testutil.RequireBinary(t, "busybox", "AENV_BUSYBOX")
	if !isStatic(busybox) {
		testutil.Unavailable(t, busybox+" is not statically linked (install busybox-static)")
	}

	m, _ := newUnfilledManager(t, 1)
	ctx := context.Background()
	s := acquire(t, m, SlotOptions{})
	dir := t.TempDir()
	// runsc leaves an nsfs mount in its state directory; runs after the
	// sandboxes' own cleanups.
	t.Cleanup(func() { unix.Unmount(filepath.Join(dir, "state", "null-netns"), unix.MNT_DETACH) })

	runHTTPD(t, runsc, busybox, dir, "one", s)
	get(t, fmt.Sprintf("http://%s:%d/", s.HostAddr, envdPort), "one")
	if n := eth0Addrs(t, s); n != 0 {
		t.Errorf("eth0 still has %d IPv4 addresses under runsc; the design assumes runsc takes them", n)
	}
	stopSandbox(t, runsc, dir, "one")

	if err := m.Recycle(ctx, s); err != nil {
		t.Fatal(err)
	}
	r := acquire(t, m, SlotOptions{})
	if r != s {
		t.Fatalf("got %s, want the recycled %s", r.Name, s.Name)
	}
	runHTTPD(t, runsc, busybox, dir, "two", r)
	get(t, fmt.Sprintf("http://%s:%d/", r.HostAddr, envdPort), "two")
	stopSandbox(t, runsc, dir, "two")
}

func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

func runscArgs(dir string, args ...string) []string {
	return append([]string{"--root", filepath.Join(dir, "state"), "--platform=systrap", "--network=sandbox"}, args...)
}

// runHTTPD starts a sandbox named id in slot s, serving id on port 49983.
func runHTTPD(t *testing.T, runsc, busybox, dir, id string, s *Slot) {
	t.Helper()
	bundle := filepath.Join(dir, id)
	rootfs := filepath.Join(bundle, "rootfs")
	for _, d := range []string{"bin", "www", "proc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "www", "index.html"), []byte(id), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]any{"uid": 0, "gid": 0},
			"args": []string{"/bin/busybox", "httpd", "-f", "-p", fmt.Sprint(envdPort), "-h", "/www"},
			"env":  []string{"PATH=/bin"},
			"cwd":  "/",
		},
		"root":     map[string]any{"path": "rootfs", "readonly": true},
		"hostname": id,
		"mounts":   []map[string]any{{"destination": "/proc", "type": "proc", "source": "proc"}},
		"linux": map[string]any{"namespaces": []map[string]any{
			{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
			{"type": "network", "path": s.SandboxNSPath},
		}},
	}
	js, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	// The detached sandbox inherits runsc's stdout and stderr: a file, not
	// a pipe that would keep the command from ever finishing.
	logPath := filepath.Join(dir, id+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(runsc, runscArgs(dir, "run", "--detach", "--bundle", bundle, id)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	t.Cleanup(func() { exec.Command(runsc, runscArgs(dir, "delete", "--force", id)...).Run() })
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(logPath)
		t.Fatalf("runsc run: %v: %s", err, out)
	}
}

func stopSandbox(t *testing.T, runsc, dir, id string) {
	t.Helper()
	if out, err := exec.Command(runsc, runscArgs(dir, "delete", "--force", id)...).CombinedOutput(); err != nil {
		t.Fatalf("runsc delete: %v: %s", err, out)
	}
}

func get(t *testing.T, url, want string) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		resp, err := client.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.TrimSpace(string(body)) == want {
				return
			}
			err = fmt.Errorf("status %s, body %q", resp.Status, body)
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("GET %s never answered %q: %v", url, want, last)
}

func eth0Addrs(t *testing.T, s *Slot) int {
	t.Helper()
	h, err := handleAt(s.SandboxNSPath, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(SandboxIfName)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	return len(addrs)
}
