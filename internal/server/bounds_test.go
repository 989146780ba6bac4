package server

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// pumpDrainTimeoutForTest is less than the time Kill waits for envd's log
// to end (gvisor's pumpDrainTimeout).
const pumpDrainTimeoutForTest = 1500 * time.Millisecond

// TestSandboxWritesAreBounded: what a sandbox writes on the host stops at
// a bound. A 64 MiB volume takes about that much and then gives ENOSPC
// inside; root writing endlessly into envd's stdout leaves envd's log on
// the host at its cap, and the logs call still answers. Deleting the
// volume leaves no image or mount.
func TestSandboxWritesAreBounded(t *testing.T) {
	srv, c, _ := startServerWith(t, func(cfg *Config) { cfg.WarmPoolMemory = -1 })
	ctx := context.Background()
	small, err := c.CreateVolume(ctx, "small", client.VolumeOptions{SizeMB: 64})
	if err != nil || small.SizeMB != 64 {
		t.Fatalf("a 64 MiB volume: %+v %v", small, err)
	}
	if def, err := c.CreateVolume(ctx, "default", client.VolumeOptions{}); err != nil || def.SizeMB != 10<<10 {
		t.Fatalf("a volume without a size: %+v %v", def, err)
	}
	if _, err := c.CreateVolume(ctx, "tiny", client.VolumeOptions{SizeMB: 1}); !isStatus(err, 400) {
		t.Fatalf("a 1 MiB volume: %v", err)
	}
	sb := mustCreate(t, c, client.CreateOptions{Timeout: 120,
		VolumeMounts: []client.VolumeMount{{Name: "small", Path: "/mnt/small"}}})

	out := runOut(t, c, sb.SandboxID, "dd if=/dev/zero of=/mnt/small/fill bs=1M count=100 2>&1 | grep -o 'No space left on device' | head -1; stat -c %s /mnt/small/fill")
	msg, size, _ := strings.Cut(out, "\n")
	n, _ := strconv.ParseInt(size, 10, 64)
	if msg != "No space left on device" || n < 48<<20 || n > 64<<20 {
		t.Fatalf("filling a 64 MiB volume: %q, %d bytes written", msg, n)
	}
	img := filepath.Join(srv.cfg.DataDir, "volumes", small.VolumeID+".ext4")
	if fi, err := os.Stat(img); err != nil || fi.Size() != 64<<20 {
		t.Fatalf("the volume's image: %v %v", fi, err)
	}

	var errOut bytes.Buffer
	code, err := c.Run(ctx, sb.SandboxID, "timeout 5 sh -c 'cat /dev/zero > /proc/1/fd/1'; id -u",
		client.RunOptions{User: "root", Stdout: &errOut, Stderr: &errOut})
	if err != nil || code != 0 || !strings.HasSuffix(errOut.String(), "0\n") {
		t.Fatalf("writing into envd's stdout as root: %d %v %q", code, err, errOut.String())
	}
	dir := filepath.Join(srv.cfg.RunDir, "gvisor", "sandboxes", sb.SandboxID)
	var total int64
	for _, name := range []string{"envd.log", "envd.log.1"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > 8<<20 {
			t.Fatalf("%s holds %d bytes: over its 8 MiB cap", name, fi.Size())
		}
		total += fi.Size()
	}
	// Just after a rotation the two files hold the cap less at most one
	// cut line (64 KiB): envd.log.1 stopped short of the line that rotated.
	if total < 8<<20-64<<10 {
		t.Fatalf("envd's log holds %d bytes after 5 s of zeros: nothing was written?", total)
	}
	// envd lives on, its log of processes still read. The driver copies
	// envd's output into the log as it comes, behind up to a pipe's worth
	// (1 MiB) of the zeros; a logs call waits up to 250 ms for that copy
	// to catch up, and under -race beside other packages it may not:
	// the lines are looked for again, for up to 5 s.
	runOut(t, c, sb.SandboxID, "true")
	var logs []client.LogEntry
	started := 0
	for deadline := time.Now().Add(5 * time.Second); started == 0 && time.Now().Before(deadline); {
		start := time.Now()
		logs, err = c.Logs(ctx, sb.SandboxID, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("logs: %d entries in %v", len(logs), time.Since(start))
		for _, e := range logs {
			if e.Message == "process started" {
				started++
			}
		}
		if started == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if started == 0 {
		t.Fatalf("the sandbox's logs lack the processes it ran 5 s after the last: %+v", logs)
	}

	killStart := time.Now()
	must(t, c.Kill(ctx, sb.SandboxID))
	// Kill waits for envd's last lines: they come at once.
	if took := time.Since(killStart); took > pumpDrainTimeoutForTest {
		t.Errorf("killing the sandbox took %v: waiting for envd's log?", took)
	}
	must(t, c.DeleteVolume(ctx, small.VolumeID))
	if _, err := os.Stat(img); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the deleted volume's image: %v", err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), small.VolumeID) {
		t.Fatal("the deleted volume is still mounted")
	}
}
