package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/template/erofs"
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
	stores := []storeSpec{
		{"local", filepath.Join(tmp, "store"), [2]string{}},
		{"s3", "s3://images/c?region=us-east-1&path_style=true&endpoint=" + gw.Endpoint, [2]string{gw.AccessKey, gw.SecretKey}},
	}
	if os.Getenv("AENV_BENCH_STORES") == "local" {
		stores = stores[:1]
	}
	// The template, built on a host of its own, is published to both.
	tpls := map[string]*template.Template{}
	var tpl *template.Template
	for _, s := range stores {
		start := time.Now()
		tpl = publishTree(b, ctx, filepath.Join(tmp, "publisher-"+s.name), root, s.url, s.keys)
		tpls[s.name] = tpl
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
		if srv.host.ImageServer() != nil {
			if info, err := srv.host.ImageServer().Info(ctx); err == nil {
				for _, img := range info.Images {
					fetched += img.FetchedBytes
				}
			}
		}
		return took, fetched
	}
	// warm is the median of warmRuns starts on a node that has started
	// the template before, with the page cache as it is or dropped.
	const warmRuns = 5
	warm := func(c *client.Client, srv *Server, drop bool) time.Duration {
		var ds []time.Duration
		for range warmRuns {
			if drop {
				dropPageCache()
			}
			d, _ := measure(c, srv)
			ds = append(ds, d)
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	node := func(s storeSpec, rootfs string) (*Server, *client.Client) {
		srv, c, _ := startServerWith(b, func(cfg *Config) {
			cfg.StoreURL, cfg.StoreAccessKey, cfg.StoreSecretKey = s.url, s.keys[0], s.keys[1]
			cfg.RootFS, cfg.WarmPoolMemory = rootfs, -1
			cfg.Logger = slog.New(slog.DiscardHandler)
		})
		return srv, c
	}
	stored := map[string]int64{}
	for _, s := range stores {
		img := tpls[s.name].BlockImage
		stored[s.name] = storedBytes(b, ctx, s.url, s.keys, img)
		for _, mode := range []string{"lazy", "eager", "unpack"} {
			srv, c := node(s, map[string]string{"lazy": agent.RootFSImage, "eager": agent.RootFSEager, "unpack": agent.RootFSDir}[mode])
			dropPageCache()
			took, fetched := measure(c, srv)
			if mode != "lazy" {
				fetched = stored[s.name]
			}
			rows = append(rows, row{s.name, mode, "cold", took, fetched})
			rows = append(rows, row{s.name, mode, "warm", warm(c, srv, false), 0})
			rows = append(rows, row{s.name, mode, "warm, page cache dropped", warm(c, srv, true), 0})
			must(b, srv.Close(ctx))
			if mode != "lazy" {
				continue
			}
			// The first start recorded what it read: a cold start on
			// another node fetches that first, in one batch.
			waitTrace(b, ctx, s.url, s.keys, img)
			srv, c = node(s, agent.RootFSImage)
			dropPageCache()
			took, fetched = measure(c, srv)
			rows = append(rows, row{s.name, mode, "cold, prefetch list", took, fetched})
			must(b, srv.Close(ctx))
		}
	}
	// The baseline: the tree on the node that built the template.
	srv, c, _ := startServerWith(b, func(cfg *Config) {
		cfg.RootFS, cfg.WarmPoolMemory = agent.RootFSDir, -1
		cfg.Logger = slog.New(slog.DiscardHandler)
	})
	copyTemplate(b, filepath.Join(tmp, "publisher-"+stores[0].name), srv.cfg.DataDir, tpl.ID)
	measure(c, srv)
	rows = append(rows, row{"-", "tree", "warm", warm(c, srv, false), 0})
	rows = append(rows, row{"-", "tree", "warm, page cache dropped", warm(c, srv, true), 0})

	fmt.Printf("\n%s: %d MiB image (%d MiB tree, %d MiB as stored, compressed); first command: %s; warm: median of %d\n",
		tpl.ID, tpl.ImageBytes>>20, tpl.SizeBytes>>20, stored[stores[0].name]>>20, cmd, warmRuns)
	fmt.Printf("%-6s %-7s %-25s %8s %12s %9s\n", "store", "mode", "start", "ms", "fetched MiB", "% stored")
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].store < rows[j].store })
	for _, r := range rows {
		pct := ""
		if r.fetched > 0 {
			pct = fmt.Sprintf("%.1f", 100*float64(r.fetched)/float64(stored[r.store]))
		}
		fmt.Printf("%-6s %-7s %-25s %8d %12.1f %9s\n", r.store, r.mode, r.phase, r.took.Milliseconds(), float64(r.fetched)/(1<<20), pct)
	}
	took := func(store, mode, phase string) time.Duration {
		for _, r := range rows {
			if r.store == store && r.mode == mode && r.phase == phase {
				return r.took
			}
		}
		return 0
	}
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	for _, s := range stores {
		lazy := took(s.name, "lazy", "cold")
		fmt.Printf("%s: cold lazy is %.1fx faster than eager, %.1fx than unpack; with the prefetch list %.1fx and %.1fx; warm lazy is %.2fx the tree's (page cache dropped: %.2fx)\n",
			s.name, ratio(took(s.name, "eager", "cold"), lazy), ratio(took(s.name, "unpack", "cold"), lazy),
			ratio(took(s.name, "eager", "cold"), took(s.name, "lazy", "cold, prefetch list")),
			ratio(took(s.name, "unpack", "cold"), took(s.name, "lazy", "cold, prefetch list")),
			ratio(took(s.name, "lazy", "warm"), took("-", "tree", "warm")),
			ratio(took(s.name, "lazy", "warm, page cache dropped"), took("-", "tree", "warm, page cache dropped")))
	}
}

// storeSpec names a store the benchmark publishes to.
type storeSpec struct {
	name, url string
	keys      [2]string
}

// waitTrace waits for the prefetch list of image to be stored.
func waitTrace(b *testing.B, ctx context.Context, url string, keys [2]string, image string) {
	backend, err := store.Open(ctx, url, store.OpenOptions{AccessKeyID: keys[0], SecretAccessKey: keys[1]})
	must(b, err)
	s, err := store.New(store.Options{Backend: backend})
	must(b, err)
	defer s.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := s.Get(ctx, image+"-trace"); err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("no prefetch list was stored for %s", image)
		}
		time.Sleep(time.Second)
	}
}

// publishTree makes template "big" of the tree at root in its own data
// directory and publishes it to the store at url.
func publishTree(b *testing.B, ctx context.Context, dir, root, url string, keys [2]string) *template.Template {
	backend, err := store.Open(ctx, url, store.OpenOptions{AccessKeyID: keys[0], SecretAccessKey: keys[1]})
	must(b, err)
	remote, err := store.New(store.Options{Backend: backend})
	must(b, err)
	images, err := store.New(agent.ImageStoreOptions(backend))
	must(b, err)
	ts, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(dir, "templates"), Remote: remote, Images: images, Blocks: erofs.Images{}})
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
