package server

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// BenchmarkDiskLayout compares where a sandbox's files go, with 1 GiB
// written: in its memory (--disk-size=-1, the layout before disks) and on
// the host's disk (the default). Per layout it reports the median create,
// snapshot (the sandbox keeps running), pause and resume.
//
//	go test -run '^$' -bench DiskLayout -benchtime 3x ./internal/server/
func BenchmarkDiskLayout(b *testing.B) {
	for _, layout := range []struct {
		name   string
		diskMB int
	}{{"memory", -1}, {"disk", 0}} {
		b.Run(layout.name, func(b *testing.B) {
			_, c, _ := startServerWith(b, func(cfg *Config) { cfg.WarmPoolMemory = -1; cfg.DiskMB = layout.diskMB })
			ctx := context.Background()
			var create, snap, pause, resume []time.Duration
			for b.Loop() {
				t0 := time.Now()
				sb := mustCreate(b, c, client.CreateOptions{Timeout: 600, MemoryMB: 2048})
				create = append(create, time.Since(t0))
				runOut(b, c, sb.SandboxID, "dd if=/dev/urandom of=/home/user/blob bs=1M count=1024 status=none")
				t0 = time.Now()
				s, err := c.Snapshot(ctx, sb.SandboxID, "")
				if err != nil {
					b.Fatal(err)
				}
				snap = append(snap, time.Since(t0))
				t0 = time.Now()
				if err := c.Pause(ctx, sb.SandboxID); err != nil {
					b.Fatal(err)
				}
				pause = append(pause, time.Since(t0))
				t0 = time.Now()
				if _, _, err := c.Connect(ctx, sb.SandboxID, time.Minute); err != nil {
					b.Fatal(err)
				}
				resume = append(resume, time.Since(t0))
				if out := runOut(b, c, sb.SandboxID, "stat -c %s /home/user/blob"); out != "1073741824" {
					b.Fatalf("after resume the file is %s bytes", out)
				}
				c.Kill(ctx, sb.SandboxID)
				c.DeleteTemplate(ctx, s.SnapshotID) // a snapshot is deleted as the template it is
			}
			med := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2].Milliseconds())
			}
			b.ReportMetric(med(create), "create-ms")
			b.ReportMetric(med(snap), "snapshot-ms")
			b.ReportMetric(med(pause), "pause-ms")
			b.ReportMetric(med(resume), "resume-ms")
		})
	}
}
