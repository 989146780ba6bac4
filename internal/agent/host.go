package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/egress"
	"github.com/aenvhq/aenv/internal/envd"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/node/nodeserver"
	"github.com/aenvhq/aenv/internal/runtime/gvisor"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/template/erofs"
	"github.com/aenvhq/aenv/internal/volume"
)

// Host is what runs sandboxes on this machine, for the in-process node of
// `aenv server` and for `aenv node` alike: templates, the runtime
// driver, sandbox networking, the snapshot catalog and its store, and the
// node that joins them, answering the node API.
type Host struct {
	templates      *template.Catalog
	driver         *gvisor.Driver
	net            *netns.Manager
	stopWatch      context.CancelFunc
	members        *memberWatch // nil: not kept off the cluster's members
	remote         *store.Repository
	images         *store.Repository
	imageServer    *blockimage.Client
	node           *node.Node
	api            *nodeserver.Local
	volumes        *volume.Dir
	runtimeVersion string
	log            *slog.Logger
	// publishing is the start's publish of base's image, which stopWatch
	// cancels too.
	publishing sync.WaitGroup
	// nodeMux is what NodeHandler and TLSNodeHandler serve, made once.
	nodeMuxOnce sync.Once
	nodeMux     http.Handler
}

// OpenHost sets the host up and starts its node, which takes over the
// sandboxes an earlier process left running; keys are the cluster's data
// keys, which seal the snapshot catalog's secrets. On error nothing is
// left.
func OpenHost(ctx context.Context, cfg Config, keys *sealed.Keyring, log *slog.Logger) (_ *Host, err error) {
	h := &Host{log: log}
	defer func() {
		if err != nil {
			h.Close(context.WithoutCancel(ctx), membership.StopKill)
		}
	}()
	if err := h.open(ctx, cfg, keys, log); err != nil {
		return nil, err
	}
	builds, err := buildConfig(cfg, h.node, h.templates)
	if err != nil {
		return nil, err
	}
	pulls, err := pullConfig(cfg, h.templates)
	if err != nil {
		return nil, err
	}
	opts := nodeserver.LocalOptions{
		Templates: h.templates, RuntimeVersion: h.runtimeVersion, Version: envd.Version,
		Builds: builds, Pulls: pulls,
	}
	if h.imageServer != nil {
		// On the heartbeat's Info: the node's record carries its cache.
		opts.ImageCache = h.imageServer.CacheStats
	}
	h.api = nodeserver.NewLocal(h.node, opts)
	return h, nil
}

// warmTemplates are the templates the warm pool keeps prestarted.
func warmTemplates(cfg Config) []string {
	if cfg.CodeInterpreterRootFS != "" {
		return []string{template.BaseID, template.CodeInterpreterID}
	}
	return []string{template.BaseID}
}

func (h *Host) open(ctx context.Context, cfg Config, keys *sealed.Keyring, log *slog.Logger) error {
	envdPath, err := findEnvd(cfg.EnvdPath)
	if err != nil {
		return err
	}
	if h.remote, h.images, err = OpenStore(ctx, cfg, log); err != nil {
		return err
	}
	templates, err := OpenTemplates(cfg, h.remote, h.images, log)
	if err != nil {
		return err
	}
	if err := ensureBase(ctx, templates, log); err != nil {
		return err
	}
	if baseImage(cfg) {
		ensureBaseImage(ctx, templates.BaseRootFS(), log)
	}
	h.templates = templates

	gcfg := gvisorConfig(cfg, log)
	gcfg.PidsTotal = cfg.PidsTotal
	driver, err := gvisor.New(gcfg)
	if err != nil {
		return err
	}
	h.driver = driver

	prefix, err := netip.ParsePrefix(cfg.SandboxCIDR)
	if err != nil {
		return fmt.Errorf("parsing sandbox CIDR %q: %w", cfg.SandboxCIDR, err)
	}
	dns := netns.HostDNSServers("/etc/resolv.conf")
	if len(cfg.DNSServers) > 0 {
		dns = cfg.DNSServers
	}
	hostNets, err := netns.DetectHostNetworks(cfg.NetnsTag)
	if err != nil {
		return fmt.Errorf("reading the host's networks: %w", err)
	}
	// The members are read before the host's rules are laid, so that
	// sandboxes an earlier process left running are never without them.
	var members *memberWatch
	var memberAddrs []netip.Addr
	if cfg.Cluster != nil {
		if members, memberAddrs, err = openMemberWatch(ctx, cfg.Cluster, cfg.EtcdEndpoints, log); err != nil {
			return err
		}
	}
	h.net, err = netns.NewManager(ctx, netns.Config{
		HostNetworks: hostNets,
		ClusterAddrs: memberAddrs,
		EgressAllow:  cfg.EgressAllow,
		DNSServers:   dns,
		RunDir:       filepath.Join(cfg.RunDir, "netns"),
		Prefix:       prefix,
		PoolSize:     cfg.NetnsPoolSize,
		Tag:          cfg.NetnsTag,
		Logger:       log,
		// The slots of sandboxes that outlived the previous process.
		KeepLeftovers: true,
		OnEgressRefused: func(s *netns.Slot, r egress.Refusal) {
			if h.node != nil {
				h.node.EgressRefused(s, r)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("setting up sandbox networking: %w", err)
	}
	log.Info("sandboxes are kept off the host's networks", "networks", hostNets, "exempt", cfg.EgressAllow)
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	h.stopWatch = stopWatch
	if baseImage(cfg) && h.images != nil {
		h.publishing.Add(1)
		go func() {
			defer h.publishing.Done()
			h.publishBaseImage(watchCtx)
		}()
	}
	if err := netns.WatchHostNetworks(watchCtx, cfg.NetnsTag, func(ps []netip.Prefix) {
		if err := h.net.SetHostNetworks(ps); err != nil {
			log.Error("updating the host networks kept from sandboxes", "err", err)
		}
	}); err != nil {
		return err
	}
	if members != nil {
		log.Info("sandboxes are kept off the cluster's members", "addrs", memberAddrs)
		members.run(watchCtx, memberAddrs, h.net.SetClusterAddrs)
		h.members = members
	}

	snapshots, err := snapshot.Open(filepath.Join(cfg.DataDir, "snapshots"), h.remote, keys)
	if err != nil {
		return err
	}
	if h.volumes, err = volume.Open(filepath.Join(cfg.DataDir, "volumes")); err != nil {
		return err
	}
	// After a reboot the volumes' images are no longer mounted; a volume
	// that fails to mount fails its own uses, not the node.
	if err := h.volumes.MountAll(); err != nil {
		log.Warn("mounting volumes", "err", err)
	}
	h.runtimeVersion = driver.Version(ctx)
	rootfs, imageServer, err := openRootFS(ctx, cfg, envdPath, log)
	if err != nil {
		return err
	}
	h.imageServer = imageServer
	h.node, err = node.New(node.Config{
		Keys:                keys,
		RootFS:              rootfs,
		Snapshots:           snapshots,
		Volumes:             h.volumes,
		Store:               h.remote,
		ID:                  cfg.NodeID,
		Runtime:             driver,
		RuntimeVersion:      h.runtimeVersion,
		Network:             h.net,
		Templates:           templates,
		EnvdPath:            envdPath,
		EnvdVersion:         envd.Version,
		DNSServers:          addrStrings(dns),
		BuildWithoutNetwork: cfg.BuildWithoutNetwork,
		// Keep base sandboxes prestarted: the E2B default template is what
		// most creates ask for.
		WarmPoolMemory: cfg.WarmPoolMemory,
		WarmPoolFloor:  cfg.WarmPoolFloor,
		WarmPoolMax:    cfg.WarmPoolMax,
		MaxBoots:       cfg.MaxBoots,
		WarmTemplates:  warmTemplates(cfg),
		StateDir:       filepath.Join(cfg.RunDir, "node"),
		EndedHistory: node.EndedHistory{Dir: filepath.Join(cfg.DataDir, "ended-history"),
			Retention: cfg.EndedHistoryRetention, MaxBytes: cfg.EndedHistoryBytes, MaxTeamBytes: cfg.EndedHistoryTeamBytes},
		Idle:       cfg.Idle,
		Capacity:   cfg.Capacity,
		PidsLimit:  cfg.PidsLimit,
		DiskMB:     cfg.DiskMB,
		VolumeSize: cfg.VolumeSize,
		Logger:     log,
	})
	if err != nil {
		return err
	}
	if _, err := h.node.Start(ctx); err != nil {
		return err
	}
	if err := driver.Cleanup(ctx); err != nil {
		log.Warn("cleaning up sandboxes of a previous run", "err", err)
	}
	return nil
}

// Close stops the node: its sandboxes are killed with StopKill, else they
// keep running, with their network slots and the host rules that isolate
// them, for the next process to take over (pausing them first is the
// cluster's). The warm pool's prestarted sandboxes are killed either way
// (a pool is a cache, which nothing would take over), and the image
// server stops unless a sandbox kept runs on one of its images.
func (h *Host) Close(ctx context.Context, stop membership.StopMode) error {
	mode := node.KeepSandboxes
	if stop == membership.StopKill {
		mode = node.KillSandboxes
	}
	var errs []error
	if h.stopWatch != nil {
		h.stopWatch()
	}
	h.publishing.Wait()
	if h.members != nil {
		h.members.wait()
	}
	kept := 0
	var keptImages []string
	if h.node != nil {
		errs = append(errs, h.node.Close(ctx, mode))
		kept, keptImages = len(h.node.List()), h.node.RootImages()
	}
	if h.net != nil {
		if kept > 0 {
			errs = append(errs, h.net.Detach(ctx))
		} else {
			errs = append(errs, h.net.Close(ctx))
		}
	}
	if h.driver != nil {
		errs = append(errs, h.driver.Close())
	}
	if h.remote != nil {
		errs = append(errs, h.remote.Close())
	}
	if h.images != nil {
		errs = append(errs, h.images.Close())
	}
	// With no sandbox left on a block image (the pool's are gone, and
	// sandboxes of templates kept as directories hold none of its mounts)
	// the image server has nothing to serve; else it serves them on for
	// the next process.
	if h.imageServer != nil && len(keptImages) == 0 {
		if err := h.imageServer.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stopping the image server: %w", err))
		}
	}
	// Nor do the volumes' mounts serve anyone; the next start mounts them.
	if h.volumes != nil && kept == 0 {
		errs = append(errs, h.volumes.UnmountAll())
	}
	if kept > 0 {
		h.log.Info("running sandboxes keep running for the next start", "count", kept, "block_images", len(keptImages))
	}
	return errors.Join(errs...)
}

// API is the node API its node answers in this process.
func (h *Host) API() *nodeserver.Local { return h.api }

// Node is the host's node.
func (h *Host) Node() *node.Node { return h.node }

// Templates are the templates of this host's data directory.
func (h *Host) Templates() *template.Catalog { return h.templates }

// Store is the store snapshots and templates are kept in beyond this
// host (nil without Config.StoreURL).
func (h *Host) Store() *store.Repository { return h.remote }

// ImageServer is the node's block image server (nil with RootFS dir).
func (h *Host) ImageServer() *blockimage.Client { return h.imageServer }

// Volumes are the volumes this host holds.
func (h *Host) Volumes() *volume.Dir { return h.volumes }

// OpenStore opens the store snapshots and templates are kept in beyond
// this host (nil without Config.StoreURL), and over the same backend the
// store block images are published to (see ImageStoreOptions); a pure
// API server opens it without a host.
func OpenStore(ctx context.Context, cfg Config, log *slog.Logger) (remote, images *store.Repository, err error) {
	if cfg.StoreURL == "" {
		return nil, nil, nil
	}
	backend, err := openBackend(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	remote, err = store.New(store.Options{
		Backend:  backend,
		CacheDir: filepath.Join(cfg.DataDir, "chunk-cache"),
		// Pages move around in memory images between snapshots;
		// content-defined chunks keep a small change a small upload.
		ContentDefined: true,
		Logger:         log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("opening the store: %w", err)
	}
	if images, err = store.New(ImageStoreOptions(backend)); err != nil {
		remote.Close()
		return nil, nil, fmt.Errorf("opening the store: %w", err)
	}
	log.Info("snapshots and templates are stored durably", "store", backend.String())
	return remote, images, nil
}

// openBackend opens the backend of Config.StoreURL.
func openBackend(ctx context.Context, cfg Config) (store.Backend, error) {
	backend, err := store.Open(ctx, cfg.StoreURL, store.OpenOptions{
		AccessKeyID: cfg.StoreAccessKey, SecretAccessKey: cfg.StoreSecretKey,
	})
	if err != nil {
		return nil, fmt.Errorf("opening the store: %w", err)
	}
	return backend, nil
}

// OpenTemplates opens the templates of this data directory, published to
// and fetched from remote when there is one.
func OpenTemplates(cfg Config, remote, images *store.Repository, log *slog.Logger) (*template.Catalog, error) {
	var builtins []*template.Template
	if cfg.CodeInterpreterRootFS != "" {
		t, err := template.CodeInterpreter(cfg.CodeInterpreterRootFS)
		if err != nil {
			return nil, err
		}
		builtins = append(builtins, t)
	}
	return template.NewCatalog(template.CatalogOptions{
		Dir: filepath.Join(cfg.DataDir, "templates"), BaseRootFS: cfg.BaseRootFS, BaseImage: baseImage(cfg), Builtins: builtins,
		Remote: remote, Images: images, Blocks: erofs.Images{}, Logger: log,
	})
}

// gvisorConfig is the runtime driver of a server or node with cfg.
func gvisorConfig(cfg Config, log *slog.Logger) gvisor.Config {
	return gvisor.Config{
		RunscPath: cfg.RunscPath,
		StateDir:  filepath.Join(cfg.RunDir, "gvisor"),
		// One cgroup parent per server instance, named like its network
		// tag, so that servers sharing a host stay apart.
		CgroupParent: "/" + cfg.NetnsTag,
		FastPath:     cfg.FastPath,
		RootImages:   cfg.RootImages,
		// Beside the snapshots, which keep hard links to them.
		ImagesDir: filepath.Join(cfg.DataDir, "tools-images"),
		Logger:    log,
	}
}

func addrStrings(as []netip.Addr) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

// findEnvd locates the envd binary: explicit path, else beside this
// executable (bin/aenv and bin/envd ship together), else PATH.
func findEnvd(explicit string) (string, error) {
	if explicit != "" {
		if _, err := os.Stat(explicit); err != nil {
			return "", fmt.Errorf("finding envd: %w", err)
		}
		return filepath.Abs(explicit)
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "envd")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(dir, "envd")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("finding envd: no envd binary beside aenv or in PATH (build it with `make build`, or pass --envd)")
}

// ensureBase builds the base template on first start.
func ensureBase(ctx context.Context, ts *template.Catalog, log *slog.Logger) error {
	if _, err := ts.Get(template.BaseID); err == nil {
		return nil
	}
	dest := ts.BaseRootFS()
	log.Info("building the base template from Debian packages (first start only; a few minutes)", "dir", dest)
	start := time.Now()
	w := &logWriter{log: log}
	if err := template.BuildBase(ctx, dest, template.BuildOptions{Log: w}); err != nil {
		return err
	}
	log.Info("base template built", "dir", dest, "took", time.Since(start).Round(time.Second))
	return nil
}

// baseImage says whether base's sandboxes run from its tree's image
// (template.CatalogOptions.BaseImage).
func baseImage(cfg Config) bool { return cfg.RootImages && cfg.BaseRootImage }

// ensureBaseImage makes the base template's EROFS image, which lets its
// sandboxes run without a gofer, when the tree has none (once per tree:
// ~1 s for base's 200 MB). Without it they run with one.
func ensureBaseImage(ctx context.Context, root string, log *slog.Logger) {
	start := time.Now()
	made, err := erofs.EnsureBaseImage(ctx, root)
	switch {
	case err != nil:
		log.Warn("base sandboxes run with a gofer: making the base template's image failed", "err", err)
	case made:
		log.Info("made the base template's image", "image", template.BaseImageFile(root), "took", time.Since(start).Round(time.Millisecond))
	}
}

// publishBaseImage puts base's image into the store ahead of the first
// snapshot of a base sandbox, which would otherwise wait for it (~200 MB
// the first time; a check after that).
func (h *Host) publishBaseImage(ctx context.Context) {
	base, err := h.templates.Get(template.BaseID)
	if err != nil || base.BaseImage == "" {
		return
	}
	if err := h.templates.PublishBaseImage(ctx, base.BaseImage); err != nil && ctx.Err() == nil {
		h.log.Warn("publishing the base template's image ahead of its sandboxes' snapshots (the first snapshot tries again)", "err", err)
	}
}

// logWriter turns a tool's output lines into debug logs.
type logWriter struct{ log *slog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimSpace(string(p)), "\n") {
		if line != "" {
			w.log.Debug(line, "component", "debootstrap")
		}
	}
	return len(p), nil
}
