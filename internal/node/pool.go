package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/template"
)

// PoolKey names what a prestarted sandbox starts from: a template, or a
// user snapshot that creates use as a template. Exactly one is set. With
// Restores, the template's are prepared sandboxes (runtime.Preparer),
// which restores of its sandboxes (resumes, forks, creates from its
// snapshots) load their state into; Shape is then their size, when it is
// not the template's own (a prepared sandbox's size is fixed when it is
// prepared).
type PoolKey struct {
	TemplateID, SnapshotID string
	Restores               bool
	Shape                  Shape
}

// Shape is a sandbox's size: its CPUs, memory and disk (MiB; 0: its files
// in memory). The zero Shape is its template's.
type Shape struct {
	CPUCount, MemoryMB, DiskMB int
}

func (k PoolKey) String() string {
	switch {
	case k.SnapshotID != "":
		return "snapshot " + k.SnapshotID
	case k.Restores && k.Shape != Shape{}:
		return fmt.Sprintf("restores of template %s sized %d CPUs, %d MiB, disk %d MiB", k.TemplateID, k.Shape.CPUCount, k.Shape.MemoryMB, k.Shape.DiskMB)
	case k.Restores:
		return "restores of template " + k.TemplateID
	}
	return "template " + k.TemplateID
}

// The warm pool's pace. The refill boots one sandbox at a time, and none
// while a create is being admitted or booted (on a small host a refill
// during a burst slows the burst's own boots more than the pool can help
// it), while the host's CPUs are busy with running work, or while its
// memory is near the node's high-water mark.
const (
	// poolTick is how often the pool sizes itself unpoked (a create, a
	// take and the end of a boot poke it).
	poolTick = time.Second
	// refillHold is how long after a take the refill waits (see
	// warmPool.holdUntil): a command's round trip, a few times over.
	refillHold = 50 * time.Millisecond
	// refillLull is how long creates must pause before the refill boots
	// a key that still holds its reserve (streamReserve): a stream of
	// creates one after another otherwise has a boot (~300-600 ms of
	// wall time on 2 cores) beside every create it spans, which measured
	// 20-23 ms to first command without a refill and 30-50 ms beside
	// one. Deferring loses the stream nothing: a refill one boot at a
	// time falls behind it either way, and what it defers it boots in
	// the pause.
	refillLull = 500 * time.Millisecond
	// poolCPUBusy: no refill while the host's CPUs were busier than this
	// since the pool last looked.
	poolCPUBusy = 0.8
	// poolMemoryMargin: no refill while the host's memory use is within
	// this fraction of the node's high-water mark (above it the pool
	// shrinks), so that the pool does not boot into its own shrinking.
	poolMemoryMargin = 0.05
	// poolRetry is how long a key whose boot failed waits to be tried
	// again.
	poolRetry = 5 * time.Second
	// poolMeasureEvery is how often the prestarted sandboxes' memory is
	// read (a cgroup file each).
	poolMeasureEvery = 10 * time.Second
	// defaultPooledBytes is the host memory a prestarted sandbox is taken
	// to cost before one of its key was measured: an idle base sandbox
	// takes 20 to 40 MiB here.
	defaultPooledBytes = 40 << 20
	// DefaultWarmPoolMemoryMax bounds the default budget (Config.
	// WarmPoolMemory), which is otherwise DefaultWarmPoolMemoryShare of
	// the node's memory.
	DefaultWarmPoolMemoryMax = 1 << 30
	// DefaultWarmPoolMemoryShare is the share of the node's memory the
	// default budget is.
	DefaultWarmPoolMemoryShare = 0.05
)

// pooled is one prestarted sandbox.
type pooled struct {
	sb *Sandbox
	// version is what it was booted from (templateVersion), so that a
	// template rebuilt since does not hand out its old tree.
	version string
	// memBytes is the host memory it was last measured to take (0: not
	// yet).
	memBytes int64
	// mb is the memory, in MiB, admission counts it at: what it is
	// configured with, or for a prepared sandbox (which holds no guest
	// memory until a restore fills it) preparedMB.
	mb int
}

// warmPool keeps sandboxes booted ahead of demand, so that a create only
// binds one (egress, envd's environment and token, registration: a few
// milliseconds) instead of booting one (a runsc start is ~170 ms here,
// and a burst's boots queue on the CPUs). Each key's pool is sized from
// its recent demand (poolsize.go) within a budget of host memory, and
// keys listed with a floor keep that many whatever the demand. One
// goroutine sizes the pool: it kills what is past a key's target at once
// and boots what is short one sandbox at a time, when the host can spare
// it. Prestarted sandboxes count toward the node's admission as running
// ones do; a create that does not fit because of them makes room by
// killing some (evict).
//
// A template's prestarted sandboxes run its default resources with
// internet access on (what nearly every create asks for); a snapshot's
// run with egress closed until they are taken, as their processes are
// some user's.
type warmPool struct {
	n *Node
	// budget is the host memory, in bytes, the pool may hold (0: none:
	// the pool is off).
	budget int64
	// floors are the templates kept prestarted whatever the demand, floor
	// each.
	floors []string
	floor  int
	// ceiling bounds each key's pool (0: only the budget does).
	ceiling int
	now     func() time.Time

	mu      sync.Mutex
	ready   map[PoolKey][]*pooled
	demand  *demand
	targets map[PoolKey]int
	// cost is each key's last measured memory per sandbox.
	cost map[PoolKey]int64
	// retryAt holds keys whose boot failed, until when they wait.
	retryAt map[PoolKey]time.Time
	// served counts creates of each key, warm or not (for /metrics).
	served map[PoolKey]*PoolCounts
	// measuredAt is when the prestarted sandboxes' memory was last read.
	measuredAt time.Time
	// shortOf is, for each key the budget holds below its demand, the
	// demand that was logged (logShortLocked).
	shortOf map[PoolKey]int

	// holdUntil (wall clock) is when a refill may start after a take: a
	// taken sandbox's first command comes right after its create, and a
	// refill's boot beside it, on a small host, takes the CPUs it runs on.
	// lullUntil is when creates will have paused for lullFor; a key that
	// still holds its reserve (streamReserve) is refilled only then.
	holdUntil, lullUntil time.Time
	// holdFor and lullFor are refillHold and refillLull, but in tests.
	holdFor, lullFor time.Duration

	kick   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once // starts the refill, or (close) marks it never ran
	done   chan struct{}
}

// PoolCounts are the creates of one key since the node started.
type PoolCounts struct {
	// Warm were served by a prestarted sandbox, Cold booted one.
	Warm, Cold uint64
}

// poolSizing is how a node's warm pool is sized (see Config).
type poolSizing struct {
	// budget is the host memory the pool may hold, in bytes (0: no pool).
	budget int64
	// floor prestarted sandboxes of each of floors are kept whatever the
	// demand; ceiling bounds each key's pool (0: only budget does).
	floor, ceiling int
	floors         []string
}

func newWarmPool(n *Node, sz poolSizing, now func() time.Time) *warmPool {
	p := &warmPool{n: n, budget: max(sz.budget, 0), floor: max(sz.floor, 0), ceiling: max(sz.ceiling, 0), floors: sz.floors, now: now,
		ready: map[PoolKey][]*pooled{}, demand: newDemand(), targets: map[PoolKey]int{},
		cost: map[PoolKey]int64{}, retryAt: map[PoolKey]time.Time{}, served: map[PoolKey]*PoolCounts{}, shortOf: map[PoolKey]int{},
		kick: make(chan struct{}, 1), done: make(chan struct{}), holdFor: refillHold, lullFor: refillLull}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// start begins sizing the pool. It waits for the node's Start: a refill
// running while Start recovers an earlier process's sandboxes would look
// like one of them.
func (p *warmPool) start() {
	p.once.Do(func() {
		if p.budget <= 0 {
			close(p.done)
			return
		}
		go p.run(p.ctx)
		p.poke()
	})
}

func (p *warmPool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// poolable says whether a create of tpl as req could be served by a
// prestarted sandbox: one that names no id (a prestarted sandbox has its
// own), mounts nothing and takes the template's resources.
func poolable(tpl *template.Template, req CreateRequest) bool {
	return req.SandboxID == "" && len(req.Mounts) == 0 &&
		(req.CPUCount == 0 || req.CPUCount == tpl.CPUCount) &&
		(req.MemoryMB == 0 || req.MemoryMB == tpl.MemoryMB)
}

// snapshotPoolable says the same of a create from snap: only a user
// snapshot used as a template, restored whole, without volumes.
func snapshotPoolable(snap *snapshot.Snapshot, req CreateRequest) bool {
	return snap.Kind == snapshot.KindSnapshot && req.SandboxID == "" && !req.Reboot && !snap.FilesOnly &&
		len(snap.Mounts) == 0 && len(req.Mounts) == 0
}

// templateVersion tells a template's builds apart.
func templateVersion(tpl *template.Template) string {
	return fmt.Sprintf("%d\x00%s\x00%s", tpl.CreatedAt.UnixNano(), tpl.BlockImage, tpl.RootFS)
}

// take counts a create of key and returns a prestarted sandbox of it
// booted from version, or nil; a stale one (its template rebuilt since)
// is killed.
func (p *warmPool) take(key PoolKey, version string) *Sandbox {
	if p.budget <= 0 {
		return nil
	}
	p.mu.Lock()
	p.demand.record(key, p.now())
	// Not pushed further by later takes: under a steady stream of creates
	// a pool below its reserve still refills.
	now := time.Now()
	if now.After(p.holdUntil) {
		p.holdUntil = now.Add(p.holdFor)
	}
	p.lullUntil = now.Add(p.lullFor)
	c := p.served[key]
	if c == nil {
		c = &PoolCounts{}
		p.served[key] = c
	}
	var got *Sandbox
	var stale []*pooled
	list := p.ready[key]
	for len(list) > 0 && got == nil {
		e := list[0]
		list = list[1:]
		if e.version == version {
			got = e.sb
		} else {
			stale = append(stale, e)
		}
	}
	p.setReadyLocked(key, list)
	if got != nil {
		c.Warm++
	} else {
		c.Cold++
	}
	p.mu.Unlock()
	p.poke()
	p.destroyAll(stale)
	return got
}

// streamReserve is the stock of a key, sized to target, below which its
// refill no longer waits for creates to pause: a quarter of it, and one.
func streamReserve(target int) int { return max(1, (target+3)/4) }

// untake is a create that took nothing after all (its sandbox went bad,
// and it booted one), so that it counts as cold.
func (p *warmPool) untake(key PoolKey) {
	p.mu.Lock()
	if c := p.served[key]; c != nil && c.Warm > 0 {
		c.Warm--
		c.Cold++
	}
	p.mu.Unlock()
}

// setReadyLocked sets key's prestarted sandboxes, and tells the node's
// OnPoolChange when key's ran out or came back.
func (p *warmPool) setReadyLocked(key PoolKey, list []*pooled) {
	if (len(p.ready[key]) == 0) != (len(list) == 0) {
		p.n.poolChanged()
	}
	if len(list) == 0 {
		delete(p.ready, key)
		return
	}
	p.ready[key] = list
}

// memoryMB is the memory the prestarted sandboxes are configured with.
func (p *warmPool) memoryMB() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	total := 0
	for _, list := range p.ready {
		for _, e := range list {
			total += e.mb
		}
	}
	return total
}

// list returns the prestarted sandboxes, prepared ones included.
func (p *warmPool) list() []*Sandbox { return p.listOf(true) }

// listOf returns the prestarted sandboxes, prepared ones too if asked.
func (p *warmPool) listOf(prepared bool) []*Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*Sandbox
	for k, l := range p.ready {
		if k.Restores && !prepared {
			continue
		}
		for _, e := range l {
			out = append(out, e.sb)
		}
	}
	return out
}

// remove drops a prestarted sandbox that died; it returns nil if id is not
// in the pool.
func (p *warmPool) remove(id string) *Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, list := range p.ready {
		for i, e := range list {
			if e.sb.ID == id {
				p.setReadyLocked(key, slices.Delete(list, i, i+1))
				p.poke()
				return e.sb
			}
		}
	}
	return nil
}

// forget drops key (its template or snapshot is gone): its demand, and
// its prestarted sandboxes, which it kills.
func (p *warmPool) forget(key PoolKey) {
	p.mu.Lock()
	list := p.ready[key]
	p.setReadyLocked(key, nil)
	delete(p.targets, key)
	p.demand.forget(key)
	p.mu.Unlock()
	p.destroyAll(list)
}

// destroyAll kills prestarted sandboxes no longer in the pool.
func (p *warmPool) destroyAll(list []*pooled) {
	for _, e := range list {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := p.n.destroy(ctx, e.sb); err != nil {
			p.n.log.Warn("killing a prestarted sandbox", "sandbox_id", e.sb.ID, "err", err)
		}
		cancel()
	}
}

// evict kills prestarted sandboxes configured with at least needMB
// together, if the pool holds that many, so that a create that does not
// fit beside them can: the keys least in demand first, the youngest
// sandbox of a key first. It returns the MiB freed.
func (p *warmPool) evict(needMB int) int {
	p.mu.Lock()
	now := p.now()
	keys := make([]PoolKey, 0, len(p.ready))
	for k := range p.ready {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b PoolKey) int {
		return cmp.Or(cmp.Compare(p.demand.peak(a, now), p.demand.peak(b, now)), cmp.Compare(a.String(), b.String()))
	})
	var victims []*pooled
	freed := 0
	for _, k := range keys {
		list := p.ready[k]
		for freed < needMB && len(list) > 0 {
			e := list[len(list)-1]
			list = list[:len(list)-1]
			victims = append(victims, e)
			freed += e.mb
		}
		p.setReadyLocked(k, list)
	}
	p.mu.Unlock()
	if len(victims) > 0 {
		p.n.log.Info("prestarted sandboxes killed to make room for a create", "count", len(victims), "freed_mb", freed)
	}
	p.destroyAll(victims)
	return freed
}

// run sizes the pool until ctx ends: on every poke and tick it shrinks
// what is past its targets and then boots, one at a time, what is short,
// while the host can spare it.
func (p *warmPool) run(ctx context.Context) {
	defer close(p.done)
	t := time.NewTicker(poolTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-t.C:
		}
		for ctx.Err() == nil && p.step(ctx) {
		}
	}
}

// step sizes the pool once: it kills what is past the targets, and boots
// one sandbox where one is short, if the host can spare it. It says
// whether it booted one (and so should look again at once).
func (p *warmPool) step(ctx context.Context) bool {
	total, used := p.n.load.memory()
	busy := p.n.load.cpuBusy()
	hw := p.n.cfg.Capacity.MemoryHighWater
	var over int64
	if used > hw && total > 0 {
		over = int64((used - hw) * float64(total))
	}
	p.measure(ctx)
	now := p.now()

	p.mu.Lock()
	hold := time.Until(p.holdUntil)
	p.sizeLocked(now, over)
	var surplus []*pooled
	for key, list := range p.ready {
		if t := p.targets[key]; len(list) > t {
			surplus = append(surplus, list[t:]...)
			p.setReadyLocked(key, list[:t])
		}
	}
	key, short := p.neediestLocked(now)
	if len(p.ready[key]) >= streamReserve(p.targets[key]) && p.lullUntil.After(p.holdUntil) {
		hold = time.Until(p.lullUntil)
	}
	p.mu.Unlock()
	if len(surplus) > 0 {
		p.n.log.Debug("prestarted sandboxes past the pool's targets killed", "count", len(surplus), "memory_over_bytes", over)
		p.destroyAll(surplus)
	}
	if !short || !p.hostIdle(used, busy) {
		return false
	}
	if hold > 0 {
		time.AfterFunc(hold, p.poke)
		return false
	}
	e, err := p.boot(ctx, key)
	if err != nil {
		if ctx.Err() != nil || p.n.bg.Err() != nil {
			return false
		}
		p.mu.Lock()
		p.retryAt[key] = now.Add(poolRetry)
		p.mu.Unlock()
		switch {
		case errors.Is(err, template.ErrNotFound), errors.Is(err, snapshot.ErrNotFound):
			p.forget(key)
		case errors.Is(err, ErrNoCapacity):
			p.n.log.Debug("prestarting a sandbox: no room", "pool_key", key.String(), "err", err)
		default:
			p.n.log.Warn("prestarting a sandbox failed; retrying later", "pool_key", key.String(), "err", err, "retry_in", poolRetry)
		}
		return false
	}
	p.mu.Lock()
	// Closed meanwhile (close has taken the list), or no longer wanted.
	unwanted := p.ctx.Err() != nil || len(p.ready[key]) >= p.targets[key]
	if !unwanted {
		p.setReadyLocked(key, append(p.ready[key], e))
		if e.memBytes > 0 {
			p.cost[key] = e.memBytes
		}
		delete(p.retryAt, key)
	}
	p.mu.Unlock()
	if unwanted {
		p.destroyAll([]*pooled{e})
		return false
	}
	p.n.unpend(e.sb.ID) // counted in the pool now
	return true
}

// hostIdle says whether the host can spare a boot: no create being
// admitted or booted, CPUs not busy, memory clear of the high-water mark.
func (p *warmPool) hostIdle(memUsed, cpuBusy float64) bool {
	p.n.mu.Lock()
	busy := len(p.n.pending)
	p.n.mu.Unlock()
	return busy == 0 && cpuBusy <= poolCPUBusy && memUsed <= p.n.cfg.Capacity.MemoryHighWater-poolMemoryMargin
}

// sizeLocked recomputes the targets as of now, with the host's memory
// overBytes above its high-water mark.
func (p *warmPool) sizeLocked(now time.Time, overBytes int64) {
	seen := map[PoolKey]bool{}
	var wants []poolWant
	var held int64
	add := func(k PoolKey, floor int) {
		if seen[k] {
			return
		}
		seen[k] = true
		w := poolWant{Key: k, Peak: p.demand.peak(k, now), Floor: floor, Ceiling: p.ceiling, CostBytes: p.costLocked(k)}
		wants = append(wants, w)
		held += int64(len(p.ready[k])) * w.CostBytes
	}
	_, prepares := p.n.cfg.Runtime.(runtime.Preparer)
	for _, id := range p.floors {
		add(PoolKey{TemplateID: id}, p.floor)
		if prepares {
			// So that the first resume or fork of the node's life is
			// served warm too, which the restores' demand cannot teach
			// before it happens; one holds no guest memory (preparedMB).
			add(PoolKey{TemplateID: id, Restores: true}, p.floor)
		}
	}
	var rest []PoolKey
	for _, k := range p.demand.keys(now) {
		rest = append(rest, k)
	}
	for k := range p.ready {
		rest = append(rest, k)
	}
	slices.SortFunc(rest, func(a, b PoolKey) int { return cmp.Compare(a.String(), b.String()) })
	for _, k := range rest {
		add(k, 0)
	}
	p.targets = poolTargets(wants, p.budget, held, overBytes)
	if overBytes == 0 {
		p.logShortLocked(wants)
	}
}

// logShortLocked says where the budget holds a key's pool below its
// demand, once per key and level of demand (a target that moves by one
// as the sandboxes' measured memory moves would otherwise log every few
// seconds). Why: a burst past the pool boots cold, and the operator sees
// only slow creates; the budget's default (5% of memory, at most 1 GiB)
// holds at most ~50 base sandboxes (~20 MiB each), whatever the host.
func (p *warmPool) logShortLocked(wants []poolWant) {
	for _, w := range wants {
		want := max(w.Peak, w.Floor)
		if w.Ceiling > 0 {
			want = min(want, w.Ceiling)
		}
		if want == 0 {
			delete(p.shortOf, w.Key)
			continue
		}
		target := p.targets[w.Key]
		if target >= want || p.shortOf[w.Key] >= want {
			continue
		}
		p.shortOf[w.Key] = want
		p.n.log.Info("the warm pool's memory budget holds fewer prestarted sandboxes than their demand: creates past them boot (raise --warm-pool-memory)",
			"pool_key", w.Key.String(), "target", target, "demand", want, "budget_mb", p.budget>>20, "each_mb", w.CostBytes>>20)
	}
}

// costLocked is the host memory one prestarted sandbox of key takes: the
// mean of its measured ones, else the last measured, else an estimate.
func (p *warmPool) costLocked(key PoolKey) int64 {
	var sum, n int64
	for _, e := range p.ready[key] {
		if e.memBytes > 0 {
			sum += e.memBytes
			n++
		}
	}
	if n > 0 {
		return sum / n
	}
	if c := p.cost[key]; c > 0 {
		return c
	}
	if key.Restores {
		return preparedMB << 20
	}
	return defaultPooledBytes
}

// neediestLocked is the key furthest below its target that is not
// waiting to retry, if any.
func (p *warmPool) neediestLocked(now time.Time) (PoolKey, bool) {
	var best PoolKey
	gap := 0
	for k, t := range p.targets {
		if now.Before(p.retryAt[k]) {
			continue
		}
		if g := t - len(p.ready[k]); g > gap || (g == gap && g > 0 && k.String() < best.String()) {
			best, gap = k, g
		}
	}
	return best, gap > 0
}

// measure reads the prestarted sandboxes' memory, every poolMeasureEvery.
func (p *warmPool) measure(ctx context.Context) {
	p.mu.Lock()
	if p.now().Sub(p.measuredAt) < poolMeasureEvery {
		p.mu.Unlock()
		return
	}
	p.measuredAt = p.now()
	var all []*pooled
	for _, l := range p.ready {
		all = append(all, l...)
	}
	p.mu.Unlock()
	for _, e := range all {
		if st, err := p.n.cfg.Runtime.Stats(ctx, e.sb.rt()); err == nil && st.MemoryBytes > 0 {
			p.mu.Lock()
			e.memBytes = int64(st.MemoryBytes)
			p.mu.Unlock()
		}
	}
}

// boot prestarts one sandbox of key.
func (p *warmPool) boot(ctx context.Context, key PoolKey) (*pooled, error) {
	n := p.n
	var e *pooled
	if key.SnapshotID != "" {
		if n.cfg.Snapshots == nil {
			return nil, fmt.Errorf("prestarting from snapshot %s: %w", key.SnapshotID, snapshot.ErrNotFound)
		}
		snap, err := n.cfg.Snapshots.Fetch(ctx, key.SnapshotID)
		if err != nil {
			return nil, fmt.Errorf("prestarting from snapshot %s: %w", key.SnapshotID, err)
		}
		if err := n.CanRestore(snap); err != nil {
			return nil, err
		}
		tpl, id, err := n.restoreTarget(ctx, snap, CreateRequest{})
		if err != nil {
			return nil, err
		}
		// Its processes are a user's: no egress until a create says.
		sb, err := n.boot(ctx, id, tpl, bootOptions{CPUCount: snap.CPUCount, MemoryMB: snap.MemoryMB,
			ImageDir: snap.Dir, DiskMB: snap.WritableMB, ForPool: true})
		if err != nil {
			return nil, fmt.Errorf("prestarting from snapshot %s: %w", key.SnapshotID, err)
		}
		sb.EnvdAccessToken = snap.EnvdAccessToken
		e = &pooled{sb: sb, version: snap.ID}
	} else if key.Restores {
		tpl, err := n.lookupTemplate(ctx, key.TemplateID)
		if err != nil {
			return nil, fmt.Errorf("preparing a sandbox of %s: %w", key.TemplateID, err)
		}
		sb, err := n.prepare(ctx, tpl, key.Shape)
		if err != nil {
			return nil, err
		}
		e = &pooled{sb: sb, version: templateVersion(tpl), mb: preparedMB}
	} else {
		tpl, err := n.lookupTemplate(ctx, key.TemplateID)
		if err != nil {
			return nil, fmt.Errorf("prestarting a sandbox of %s: %w", key.TemplateID, err)
		}
		opts := bootOptions{Network: netns.SlotOptions{AllowInternet: true}, ForPool: true}
		var sb *Sandbox
		if n.hasService(tpl) {
			sb, err = n.bootService(ctx, NewID(), tpl, opts)
		} else if sb, err = n.boot(ctx, NewID(), tpl, opts); err == nil {
			n.warmFirstCommand(ctx, sb)
			// Not a service's: its envd is restored from a snapshot that
			// may predate /init's dropAccessToken.
			n.initialise(ctx, sb, tpl)
		}
		if err != nil {
			return nil, err
		}
		e = &pooled{sb: sb, version: templateVersion(tpl)}
	}
	if e.mb == 0 {
		e.mb = e.sb.MemoryMB
	}
	if st, err := n.cfg.Runtime.Stats(ctx, e.sb.rt()); err == nil {
		e.memBytes = int64(st.MemoryBytes)
	}
	return e, nil
}

// poolWarmTimeout bounds warmFirstCommand: a template whose login profile
// hangs must not stop the pool's refills.
const poolWarmTimeout = 10 * time.Second

// warmFirstCommand runs `true` the way the SDKs run a command (a login
// shell, the default user) in prestarted sb, before its /init: the user's
// first command then finds envd's paths for it in use already (its HTTP
// and Connect handlers, the messages' codecs, the ready shell's hand-over,
// their code paged in and their system calls patched by gVisor's systrap).
// The template's login profile runs once more than it would have, as it
// does for any command. A failure (a template without bash) only leaves
// the first command as cold as it was.
//
// Measured with pools of 10 left idle 150 s, 16 handouts each way on the
// 2-core test host: the first command's host CPU 35 -> 29 CPU-ms, wall
// 26.9 -> 24.4 ms (medians); the pool pays 55-90 CPU-ms more per
// prestarted sandbox (the command, and the ready shell its end replaces),
// off the create's path. (A warm-up removed on stop 43 had shown no gain:
// it armed envd's 20 s idle timer, which dropped the ready shell before
// the handout; /init now disarms it.)
func (n *Node) warmFirstCommand(ctx context.Context, sb *Sandbox) {
	ctx, cancel := context.WithTimeout(ctx, poolWarmTimeout)
	defer cancel()
	if _, _, err := newProcessClient(sb).run(ctx, "true", false); err != nil {
		n.log.Debug("warming a prestarted sandbox's first command failed", "sandbox_id", sb.ID, "err", err)
	}
}

// initialise gives prestarted sb, while it waits, the /init a create
// without variables gives at its handout (the template's environment and
// directory, and a fresh access token, which only the node knows until
// the create returns it): the call into the sandbox (a fresh connection
// into its network stack), 7-11 ms of a pooled create's 10-15 on the
// 2-CPU test host, leaves the create's path. Failing, sb is
// pooled as it is and its handout initialises it.
func (n *Node) initialise(ctx context.Context, sb *Sandbox, tpl *template.Template) {
	token := randomToken()
	if err := newEnvdClient(sb.Addr, "").init(ctx, initFor(tpl, nil, token)); err != nil {
		n.log.Debug("initialising a prestarted sandbox failed; its handout will", "sandbox_id", sb.ID, "err", err)
		return
	}
	sb.EnvdAccessToken, sb.initialised = token, true
}

// close stops refilling and kills every prestarted sandbox.
func (p *warmPool) close(ctx context.Context) error {
	p.cancel()
	p.once.Do(func() { close(p.done) })
	<-p.done
	p.mu.Lock()
	var all []*pooled
	for _, list := range p.ready {
		all = append(all, list...)
	}
	p.ready = map[PoolKey][]*pooled{}
	p.mu.Unlock()
	var errs []error
	for _, e := range all {
		errs = append(errs, p.n.destroy(ctx, e.sb))
	}
	return errors.Join(errs...)
}

// PoolStatus is one key's warm pool.
type PoolStatus struct {
	Key PoolKey
	// Ready is how many prestarted sandboxes it has, Target how many it is
	// sized to, Peak its recent burst of creates.
	Ready, Target, Peak int
	// MemoryBytes is the host memory its prestarted sandboxes take (as
	// last measured, or estimated).
	MemoryBytes int64
	// Served counts its creates since the node started.
	Served PoolCounts
}

// WarmPool is the node's warm pool: its budget, and each key it holds,
// sizes or served.
type WarmPool struct {
	// BudgetBytes is the host memory the pool may hold (0: it is off).
	BudgetBytes int64
	Keys        []PoolStatus
}

// PerTemplate is w's keys, in order, with the prepared sandboxes kept per
// size merged into one key per template (Shape zero, the counts summed):
// what the node reports to the cluster and in its metrics, which know
// templates, not sizes.
func (w WarmPool) PerTemplate() []PoolStatus {
	var out []PoolStatus
	for _, k := range w.Keys {
		if k.Key.Restores {
			if i := slices.IndexFunc(out, func(o PoolStatus) bool { return o.Key.Restores && o.Key.TemplateID == k.Key.TemplateID }); i >= 0 {
				o := &out[i]
				o.Ready, o.Target, o.Peak = o.Ready+k.Ready, o.Target+k.Target, o.Peak+k.Peak
				o.MemoryBytes += k.MemoryBytes
				o.Served.Warm, o.Served.Cold = o.Served.Warm+k.Served.Warm, o.Served.Cold+k.Served.Cold
				continue
			}
			k.Key.Shape = Shape{}
		}
		out = append(out, k)
	}
	return out
}

// WarmPool describes the warm pool, its keys in order.
func (n *Node) WarmPool() WarmPool {
	p := n.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	keys := map[PoolKey]bool{}
	for k := range p.ready {
		keys[k] = true
	}
	for k := range p.targets {
		keys[k] = true
	}
	for k := range p.served {
		keys[k] = true
	}
	out := WarmPool{BudgetBytes: p.budget}
	for k := range keys {
		st := PoolStatus{Key: k, Ready: len(p.ready[k]), Target: p.targets[k], Peak: p.demand.peak(k, now)}
		st.MemoryBytes = int64(st.Ready) * p.costLocked(k)
		if c := p.served[k]; c != nil {
			st.Served = *c
		}
		out.Keys = append(out.Keys, st)
	}
	slices.SortFunc(out.Keys, func(a, b PoolStatus) int { return cmp.Compare(a.Key.String(), b.Key.String()) })
	return out
}
