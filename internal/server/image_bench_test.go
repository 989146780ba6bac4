package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/testutil/s3gw"
)

// BenchmarkImageStart measures, in one run, a node starting a sandbox of
// a large template it has never run, from a store holding the template's
// block image: the time from create to the first command's output and the
// bytes fetched, for each way the node can get the files:
//
//	lazy   the block image read on demand (--rootfs image, the default)
//	eager  the block image fetched whole first, then mounted (--rootfs eager)
//	unpack the image fetched whole and unpacked into a tree (--rootfs dir,
//	       what a node without block images did)
//
// each cold (a fresh node: empty cache) and warm (a second sandbox on the
// same node, the page cache dropped or not), through a local store and a
// real S3 server (versitygw). The baseline for warm starts is `tree`: the
// template's own directory on the node that built it. The template is
// the root filesystem only (no start command, so no memory image). Run:
//
//	AENV_BENCH_ROOTFS=/var/cache/aenv/code-interpreter-rootfs go test -run '^$' -bench ImageStart -benchtime 1x -timeout 90m ./internal/server/
func BenchmarkImageStart(b *testing.B) {
	root := os.Getenv("AENV_BENCH_ROOTFS")
	if root == "" {
		root = os.Getenv("AENV_CODE_INTERPRETER_ROOTFS")
	}
	if root == "" {
		b.Skip("set AENV_BENCH_ROOTFS to a large tree (the code-interpreter one: make code-interpreter)")
	}
	cmd := "python3 -c 'import numpy, pandas; print(1)'"
	if _, err := os.Stat(filepath.Join(root, "usr/lib/python3/dist-packages/pandas")); err != nil {
		cmd = "python3 -c 'print(1)'"
	}
	tmp := b.TempDir()
	ctx := context.Background()

	bin, err := s3gw.Build(tmp)
	if err != nil {
		b.Fatalf("building versitygw: %v", err)
	}
	gw, err := s3gw.Start(bin, filepath.Join(tmp, "s3"), false)
	if err != nil {
		b.Fatal(err)
	}
	defer gw.Stop()
	if err := gw.CreateBucket(ctx, "images"); err != nil {
		b.Fatal(err)
	}
	stores := []struct {
		name, url string
		keys      [2]string
	}{
		{"local", filepath.Join(tmp, "store"), [2]string{}},
		{"s3", "s3://images/c?region=us-east-1&path_style=true&endpoint=" + gw.Endpoint, [2]string{gw.AccessKey, gw.SecretKey}},
	}
	// The template, built on a host of its own, is published to both.
	var tpl *template.Template
	for _, s := range stores {
		start := time.Now()
		tpl = publishTree(b, ctx, filepath.Join(tmp, "publisher-"+s.name), root, s.url, s.keys)
		b.Logf("published %s (%d MiB tree, %d MiB image) to the %s store in %v", tpl.ID, tpl.SizeBytes>>20, tpl.ImageBytes>>20, s.name, time.Since(start).Round(time.Second))
	}

	type row struct {
		store, mode, phase string
		took               time.Duration
		fetched            int64
	}
	var rows []row
	measure := func(c *client.Client, srv *Server) (time.Duration, int64) {
		start := time.Now()
		sb, err := c.Create(ctx, client.CreateOptions{TemplateID: tpl.ID, Timeout: 300})
		if err != nil {
			b.Fatal(err)
		}
		var out bytes.Buffer
		if code, err := c.Run(ctx, sb.SandboxID, cmd, client.RunOptions{Stdout: &out}); err != nil || code != 0 || strings.TrimSpace(out.String()) != "1" {
			b.Fatalf("%s: %d %v %q", cmd, code, err, out.String())
		}
		took := time.Since(start)
		must(b, c.Kill(ctx, sb.SandboxID))
		var fetched int64
		if srv.host.imageServer != nil {
			if info, err := srv.host.imageServer.Info(ctx); err == nil {
				for _, img := range info.Images {
					fetched += img.FetchedBytes
				}
			}
		}
		return took, fetched
	}
	for _, s := range stores {
		for _, mode := range []string{"lazy", "eager", "unpack"} {
			rootfs := map[string]string{"lazy": RootFSImage, "eager": RootFSEager, "unpack": RootFSDir}[mode]
			srv, c, _ := startServerWith(b, func(cfg *Config) {
				cfg.StoreURL, cfg.StoreAccessKey, cfg.StoreSecretKey = s.url, s.keys[0], s.keys[1]
				cfg.RootFS, cfg.WarmPoolSize = rootfs, 0
				cfg.Logger = slog.New(slog.DiscardHandler)
			})
			dropPageCache()
			took, fetched := measure(c, srv)
			if mode != "lazy" {
				fetched = storedBytes(b, ctx, s.url, s.keys, tpl.BlockImage)
			}
			rows = append(rows, row{s.name, mode, "cold", took, fetched})
			took, _ = measure(c, srv)
			rows = append(rows, row{s.name, mode, "warm", took, 0})
			dropPageCache()
			took, _ = measure(c, srv)
			rows = append(rows, row{s.name, mode, "warm, page cache dropped", took, 0})
			must(b, srv.Close(ctx))
		}
	}
	// The baseline: the tree on the node that built the template.
	srv, c, _ := startServerWith(b, func(cfg *Config) {
		cfg.RootFS, cfg.WarmPoolSize = RootFSDir, 0
		cfg.Logger = slog.New(slog.DiscardHandler)
	})
	copyTemplate(b, filepath.Join(tmp, "publisher-local"), srv.cfg.DataDir, tpl.ID)
	measure(c, srv)
	took, _ := measure(c, srv)
	rows = append(rows, row{"-", "tree", "warm", took, 0})
	dropPageCache()
	took, _ = measure(c, srv)
	rows = append(rows, row{"-", "tree", "warm, page cache dropped", took, 0})

	fmt.Printf("\n%s: %d MiB image (%d MiB tree); first command: %s\n", tpl.ID, tpl.ImageBytes>>20, tpl.SizeBytes>>20, cmd)
	fmt.Printf("%-6s %-7s %-25s %10s %12s %8s\n", "store", "mode", "start", "ms", "fetched MiB", "% image")
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].store < rows[j].store })
	for _, r := range rows {
		pct := ""
		if r.fetched > 0 {
			pct = fmt.Sprintf("%.1f", 100*float64(r.fetched)/float64(tpl.ImageBytes))
		}
		fmt.Printf("%-6s %-7s %-25s %10d %12.1f %8s\n", r.store, r.mode, r.phase, r.took.Milliseconds(), float64(r.fetched)/(1<<20), pct)
	}
	for _, s := range stores {
		var lazy, eager, unpack time.Duration
		for _, r := range rows {
			if r.store == s.name && r.phase == "cold" {
				switch r.mode {
				case "lazy":
					lazy = r.took
				case "eager":
					eager = r.took
				case "unpack":
					unpack = r.took
				}
			}
		}
		fmt.Printf("%s: cold lazy is %.1fx faster than eager, %.1fx than unpack\n", s.name, float64(eager)/float64(lazy), float64(unpack)/float64(lazy))
	}
}

// publishTree makes template "big" of the tree at root in its own data
// directory and publishes it to the store at url.
func publishTree(b *testing.B, ctx context.Context, dir, root, url string, keys [2]string) *template.Template {
	backend, err := store.Open(ctx, url, store.OpenOptions{AccessKeyID: keys[0], SecretAccessKey: keys[1]})
	must(b, err)
	remote, err := store.New(store.Options{Backend: backend})
	must(b, err)
	images, err := store.New(store.Options{Backend: backend, ChunkSize: imageChunkSize})
	must(b, err)
	ts, err := template.NewStore(template.StoreOptions{Dir: filepath.Join(dir, "templates"), Remote: remote, Images: images})
	must(b, err)
	st, err := ts.NewStage("big")
	must(b, err)
	if out, err := exec.Command("cp", "-a", root+"/.", st.RootFS()+"/").CombinedOutput(); err != nil {
		b.Fatalf("copying %s: %v: %s", root, err, out)
	}
	must(b, st.Commit(&template.Template{ID: "big", CPUCount: 2, MemoryMB: 1024}))
	t, err := ts.GetLocal("big")
	must(b, err)
	return t
}

// storedBytes is the size of image as stored (what a whole fetch moves).
func storedBytes(b *testing.B, ctx context.Context, url string, keys [2]string, image string) int64 {
	backend, err := store.Open(ctx, url, store.OpenOptions{AccessKeyID: keys[0], SecretAccessKey: keys[1]})
	must(b, err)
	objs, err := backend.List(ctx, "chunks/")
	must(b, err)
	size := map[string]int64{}
	for _, o := range objs {
		size[o.Key[strings.LastIndexByte(o.Key, '/')+1:]] = o.Size
	}
	s, err := store.New(store.Options{Backend: backend})
	must(b, err)
	m, err := s.Get(ctx, image)
	must(b, err)
	var n int64
	seen := map[string]bool{}
	for _, c := range m.Files[0].Chunks {
		if !seen[c.Hash] {
			seen[c.Hash] = true
			n += size[c.Hash]
		}
	}
	return n
}

// copyTemplate puts template id of one data directory into another.
func copyTemplate(b *testing.B, from, to, id string) {
	dst := filepath.Join(to, "templates")
	must(b, os.MkdirAll(dst, 0o755))
	if out, err := exec.Command("cp", "-a", filepath.Join(from, "templates", id), dst+"/").CombinedOutput(); err != nil {
		b.Fatalf("copying template %s: %v: %s", id, err, out)
	}
	os.Remove(filepath.Join(dst, id, "image.erofs")) // a tree, as before block images
}

func dropPageCache() { os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200) }
