package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// ForkResult is the outcome for one child of a fork.
type ForkResult struct {
	Sandbox *Sandbox
	Err     error
}

// MaxForkCount bounds one fork request.
const MaxForkCount = 100

// RestoresPerCPU is how many of a fork's restores run at once per CPU of
// the nodes that may take its children. A restore computes for nearly all
// of its wall time (measured over all of runsc's processes with perf:
// ~120 ms of CPU in ~140 ms; an earlier reading of ~20 ms, from the
// container's cgroup alone, missed runsc, its gofer and the sentry's
// start), so more at once than there are cores only queue: 16 restores 8
// at a time took 1.49 s on 2 cores where 2 at a time took 1.15 s. A fork
// scales with the cores of the nodes that take it.
const RestoresPerCPU = 1

// forkParallelism is how many of count restores run at once on nodes with
// cpus CPUs in all.
func forkParallelism(count, cpus int) int {
	return max(1, min(count, RestoresPerCPU*max(cpus, 1)))
}

// Fork snapshots a running sandbox (which keeps running) and starts count
// independent children from that state, each with its own id, network,
// memory and writable files.
func (c *Cluster) Fork(ctx context.Context, id string, count int, timeout time.Duration, owner Owner) ([]ForkResult, error) {
	if count < 1 || count > MaxForkCount {
		return nil, fmt.Errorf("%w: count must be between 1 and %d", ErrInvalid, MaxForkCount)
	}
	if timeout <= 0 || timeout > c.cfg.Limits.MaxTimeout {
		return nil, fmt.Errorf("%w: timeout must be between 1s and %s", ErrInvalid, c.cfg.Limits.MaxTimeout)
	}
	release, err := c.withinQuota(owner, count)
	if err != nil {
		return nil, err
	}
	defer release()
	r, err := c.claim(ctx, id, StateRunning, "fork")
	if err != nil {
		return nil, err
	}
	parent := r.Sandbox
	// The children are the parent's team's, whoever asks (an admin
	// may), and count against its quota.
	childIDs := make([]string, count)
	for i := range childIDs {
		childIDs[i] = ids.New()
	}
	if _, err := c.reserveRunning(ctx, parent.TeamID(), childIDs...); err != nil {
		c.release(ctx, id, "fork")
		return nil, err
	}
	defer c.releaseUnstarted(ctx, parent.TeamID(), childIDs)
	snap, err := c.snapshotOn(ctx, r.NodeID, &nodev1.SnapshotRequest{SandboxId: id, Kind: string(snapshot.KindFork)})
	c.release(ctx, id, "fork")
	if err != nil {
		return nil, err
	}
	// The children's nodes may keep copies of it (no store).
	var copiesMu sync.Mutex
	copies := []string{r.NodeID}
	defer func() { c.deleteSnapshotQuietly(snap.Id, "fork snapshot", copies...) }()
	// Children start beside their source, whose node has the state at
	// hand; when it is full they go where there is room, restoring from
	// the store.
	p := placement{memoryMB: parent.MemoryMB, cpus: parent.CPUCount, prefer: parent.NodeID,
		runtime: snap.Runtime, runtimeVersion: snap.RuntimeVersion, prepared: preparedKey(parent.TemplateID)}
	if len(parent.Mounts) > 0 {
		p.only = parent.NodeID // children mount the same volumes
	}

	results := make([]ForkResult, count)
	// The parent's node alone, when the children must stay on it (its
	// volumes); the CPUs of every node that can take them otherwise.
	sem := make(chan struct{}, forkParallelism(count, c.nodes.cpus(p.only)))
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			nsb, n, err := c.start(ctx, p, restoreRequest(childIDs[i], parent.TeamID(), snap.Id, &parent.Spec), parent.NodeID)
			if err != nil {
				results[i].Err = err
				return
			}
			copiesMu.Lock()
			copies = append(copies, n.ID())
			copiesMu.Unlock()
			// A child is its parent's spec whole, but for its own timeout.
			spec := parent.Spec
			spec.Timeout = timeout
			sb, err := c.register(ctx, n, nsb, registration{spec: spec,
				requestedTemplate: parent.TemplateID, keyID: owner.KeyID, team: parent.TeamID()})
			results[i] = ForkResult{Sandbox: sb, Err: err}
		}()
	}
	wg.Wait()
	return results, nil
}

// releaseUnstarted gives back the reservations of a fork's children that
// did not start.
func (c *Cluster) releaseUnstarted(ctx context.Context, team string, childIDs []string) {
	if c.teamLimits(team).MaxSandboxes <= 0 {
		return
	}
	var failed []string
	for _, id := range childIDs {
		if !c.recs.has(id) {
			failed = append(failed, id)
		}
	}
	if len(failed) > 0 {
		c.releaseSlots(context.WithoutCancel(ctx), team, failed)
	}
}
