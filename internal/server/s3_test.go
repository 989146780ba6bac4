package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/testutil/s3gw"
)

// TestPauseToS3 pauses a sandbox into a real S3 server, loses the node's
// local copy, and resumes from S3 with files, processes and memory intact.
// A second snapshot after a 1 MiB change uploads only a few MiB.
func TestPauseToS3(t *testing.T) {
	tmp := t.TempDir()
	bin, err := s3gw.Build(tmp)
	if err != nil {
		t.Fatalf("building versitygw: %v", err)
	}
	gw, err := s3gw.Start(bin, filepath.Join(tmp, "s3"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Stop()
	ctx := context.Background()
	if err := gw.CreateBucket(ctx, "snaps"); err != nil {
		t.Fatal(err)
	}
	storeURL := "s3://snaps/node1?region=us-east-1&path_style=true&endpoint=" + gw.Endpoint
	srv, c, url := startServerWith(t, func(cfg *Config) {
		cfg.StoreURL = storeURL
		cfg.StoreAccessKey, cfg.StoreSecretKey = gw.AccessKey, gw.SecretKey
	})

	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 120})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.SandboxID
	defer c.Kill(ctx, id)
	runOut(t, c, id, "head -c 8M /dev/urandom > /tmp/big && echo s3 > /home/user/f && "+counterCmd)
	before := counter(t, c, id)
	if status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+id+"/pause", ""); status != 204 {
		t.Fatalf("pause: %d %v", status, body)
	}
	// The node loses its local copies: the image and the chunk cache.
	for _, d := range []string{"snapshots", "chunk-cache"} {
		entries, _ := os.ReadDir(filepath.Join(srv.cfg.DataDir, d))
		for _, e := range entries {
			os.RemoveAll(filepath.Join(srv.cfg.DataDir, d, e.Name()))
		}
	}
	if status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+id+"/connect", `{"timeout":60}`); status != 201 {
		t.Fatalf("resume from S3: %d %v", status, body)
	}
	if got := runOut(t, c, id, "cat /home/user/f"); got != "s3" {
		t.Fatalf("file after resume from S3: %q", got)
	}
	if n := counter(t, c, id); n < before {
		t.Fatalf("counter %d after resume < %d before pause", n, before)
	}

	// Incremental: snapshot, change 1 MiB, snapshot again; compare what
	// the second upload added to the bucket.
	bucketSize := func() int64 {
		var total int64
		filepath.Walk(filepath.Join(tmp, "s3", "snaps"), func(_ string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				total += fi.Size()
			}
			return nil
		})
		return total
	}
	postJSON(t, srv, url+"/sandboxes/"+id+"/snapshots", `{}`)
	mid := bucketSize()
	runOut(t, c, id, "dd if=/dev/urandom of=/tmp/big bs=1M count=1 seek=3 conv=notrunc 2>/dev/null")
	postJSON(t, srv, url+"/sandboxes/"+id+"/snapshots", `{}`)
	added := bucketSize() - mid
	if added > 6<<20 {
		t.Fatalf("a snapshot after a 1 MiB change added %d MiB to the store", added>>20)
	}
	t.Logf("second snapshot added %.1f MiB to the store", float64(added)/(1<<20))

	_, list := doRequest(t, srv, "GET", url+"/snapshots", "")
	if strings.Count(string(list), "snapshotID") != 2 {
		t.Fatalf("GET /snapshots = %s, want the two snapshots", list)
	}

	// With the store gone, a pause cannot make the state durable: it fails
	// and the sandbox runs on, counting, rather than being lost.
	gw.Stop()
	if status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+id+"/pause", ""); status == 204 {
		t.Fatalf("pause with the store down: %d %v, want an error", status, body)
	}
	if got, err := c.Get(ctx, id); err != nil || got.State != "running" {
		t.Fatalf("after a pause the store refused: %+v %v", got, err)
	}
	a := counter(t, c, id)
	time.Sleep(300 * time.Millisecond)
	if b := counter(t, c, id); b <= a {
		t.Fatalf("the sandbox stopped after a failed pause: counter %d then %d", a, b)
	}
}
