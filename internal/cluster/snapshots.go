package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/state"
)

// User snapshots (createSnapshot) belong to the team of the sandbox they
// were saved from, and their names are the team's: two teams may each
// have a snapshot "ready". The snapshot catalog, in the store the nodes
// share, holds the saved state; who owns a snapshot and what it is called
// is kept beside the records, in the state store: snapshot-owners/<id>
// and snapshot-names/<team>/<name> pointing at the id. A snapshot saved
// before teams has no owner there: only admins see it, by its catalog
// names.
const (
	snapshotOwnerPrefix = "snapshot-owners/"
	snapshotNamePrefix  = "snapshot-names/"
)

// snapshotOwner is a user snapshot's entry in the state store.
type snapshotOwner struct {
	Team string `json:"team"`
	Name string `json:"name,omitempty"`
}

func snapshotNameKey(team, name string) string { return snapshotNamePrefix + team + "/" + name }

// Snapshot saves a running sandbox's state as a snapshot of its team,
// usable as a template; the sandbox keeps running. A name the team's
// snapshots already use is ErrConflict (the api checks its templates').
func (c *Cluster) Snapshot(ctx context.Context, id, name string) (*snapshot.Snapshot, error) {
	if name != "" && !snapshot.ValidID(name) {
		return nil, fmt.Errorf("%w: invalid snapshot name %q", ErrInvalid, name)
	}
	cur, err := c.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	team := cur.TeamID()
	if err := c.withinSnapshotQuota(ctx, team); err != nil {
		return nil, err
	}
	if name != "" {
		// The name is taken first: two snapshots racing for it must not
		// both get it.
		if _, err := c.cfg.State.Create(ctx, snapshotNameKey(team, name), nil, state.WriteOptions{}); errors.Is(err, state.ErrExists) {
			return nil, fmt.Errorf("%w: a snapshot named %q exists", ErrConflict, name)
		} else if err != nil {
			return nil, fmt.Errorf("reserving snapshot name %s: %w", name, err)
		}
	}
	snap, err := c.saveSnapshot(ctx, id)
	if err == nil {
		b, _ := json.Marshal(snapshotOwner{Team: team, Name: name})
		if _, err = c.cfg.State.Put(ctx, snapshotOwnerPrefix+snap.ID, b, state.WriteOptions{}); err == nil && name != "" {
			_, err = c.cfg.State.Put(ctx, snapshotNameKey(team, name), []byte(snap.ID), state.WriteOptions{})
		}
		if err != nil {
			err = fmt.Errorf("recording snapshot %s of team %s: %w", snap.ID, team, err)
			c.deleteSnapshotQuietly(snap.ID, "snapshot that could not be recorded")
			c.cfg.State.Delete(context.WithoutCancel(ctx), snapshotOwnerPrefix+snap.ID, 0)
		}
	}
	if err != nil {
		if name != "" {
			c.cfg.State.Delete(context.WithoutCancel(ctx), snapshotNameKey(team, name), 0)
		}
		return nil, err
	}
	if name != "" {
		snap.Names = []string{name}
	}
	c.log.Info("snapshot saved", "sandbox_id", id, "snapshot_id", snap.ID, "team", team, "name", name)
	return snap, nil
}

// saveSnapshot has sandbox id's node save it, the sandbox running on.
func (c *Cluster) saveSnapshot(ctx context.Context, id string) (*snapshot.Snapshot, error) {
	r, err := c.claim(ctx, id, StateRunning, "snapshot")
	if err != nil {
		return nil, err
	}
	defer c.release(ctx, id, "snapshot")
	snap, err := c.snapshotOn(ctx, r.NodeID, &nodev1.SnapshotRequest{SandboxId: id, Kind: string(snapshot.KindSnapshot)})
	if err != nil {
		return nil, err
	}
	return nodeapi.SnapshotFromWire(snap), nil
}

// owners reads who owns which user snapshot.
func (c *Cluster) owners(ctx context.Context) (map[string]snapshotOwner, error) {
	entries, _, err := c.cfg.State.List(ctx, snapshotOwnerPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing snapshot owners: %w", err)
	}
	m := make(map[string]snapshotOwner, len(entries))
	for _, e := range entries {
		var o snapshotOwner
		if json.Unmarshal(e.Value, &o) == nil {
			m[e.Key[len(snapshotOwnerPrefix):]] = o
		}
	}
	return m, nil
}

// OwnedSnapshot is a user snapshot with its team.
type OwnedSnapshot struct {
	*snapshot.Snapshot
	// Team owns it; empty for a snapshot from before teams.
	Team string
}

// Snapshots lists the user snapshots owner sees, each named as its team
// names it.
func (c *Cluster) Snapshots(ctx context.Context, owner Owner) ([]OwnedSnapshot, error) {
	all, err := c.snapshots(ctx, snapshot.KindSnapshot)
	if err != nil {
		return nil, err
	}
	owners, err := c.owners(ctx)
	if err != nil {
		return nil, err
	}
	var out []OwnedSnapshot
	for _, s := range all {
		o, known := owners[s.ID]
		if !owner.Sees(o.Team) {
			continue
		}
		if known {
			s.Names = nil
			if o.Name != "" {
				s.Names = []string{o.Name}
			}
		}
		out = append(out, OwnedSnapshot{Snapshot: s, Team: o.Team})
	}
	return out, nil
}

// GetSnapshot returns a user snapshot owner sees: by the name its team
// gave it, else by id. Another team's is ErrNotFound, as one that does
// not exist.
func (c *Cluster) GetSnapshot(ctx context.Context, owner Owner, idOrName string) (OwnedSnapshot, error) {
	id := idOrName
	if e, err := c.cfg.State.Get(ctx, snapshotNameKey(owner.Team, idOrName)); err == nil && len(e.Value) > 0 {
		id = string(e.Value)
	} else if err != nil && !errors.Is(err, state.ErrNotFound) {
		return OwnedSnapshot{}, fmt.Errorf("looking up snapshot %q: %w", idOrName, err)
	}
	notFound := fmt.Errorf("%w: snapshot %q", ErrNotFound, idOrName)
	var o snapshotOwner
	e, err := c.cfg.State.Get(ctx, snapshotOwnerPrefix+id)
	switch {
	case err == nil:
		if json.Unmarshal(e.Value, &o) != nil {
			return OwnedSnapshot{}, notFound
		}
	case !errors.Is(err, state.ErrNotFound):
		return OwnedSnapshot{}, fmt.Errorf("looking up snapshot %q: %w", idOrName, err)
	case !owner.Admin:
		return OwnedSnapshot{}, notFound // from before teams: admins' only
	}
	if !owner.Sees(o.Team) {
		return OwnedSnapshot{}, notFound
	}
	s, err := c.GetSnapshotAny(ctx, id)
	if err != nil {
		return OwnedSnapshot{}, err
	}
	if s.Kind != snapshot.KindSnapshot {
		return OwnedSnapshot{}, notFound
	}
	if o.Team != "" {
		s.Names = nil
		if o.Name != "" {
			s.Names = []string{o.Name}
		}
	}
	return OwnedSnapshot{Snapshot: s, Team: o.Team}, nil
}

// DeleteSnapshot removes a user snapshot owner sees, and its name.
func (c *Cluster) DeleteSnapshot(ctx context.Context, owner Owner, idOrName string) error {
	s, err := c.GetSnapshot(ctx, owner, idOrName)
	if err != nil {
		return err
	}
	if err := c.deleteSnapshot(ctx, s.ID); err != nil {
		return err
	}
	if s.Team != "" {
		for _, n := range s.Names {
			c.cfg.State.Delete(ctx, snapshotNameKey(s.Team, n), 0)
		}
		c.cfg.State.Delete(ctx, snapshotOwnerPrefix+s.ID, 0)
	}
	return nil
}

// withinSnapshotQuota refuses a snapshot of a team whose snapshots take
// as many bytes as it may keep.
func (c *Cluster) withinSnapshotQuota(ctx context.Context, team string) error {
	max := c.teamLimits(team).MaxSnapshotBytes
	if max <= 0 {
		return nil
	}
	used, err := c.SnapshotBytes(ctx, team)
	if err != nil {
		return err
	}
	if used >= max {
		return fmt.Errorf("%w: team %s's snapshots take %d of its %d bytes; delete some first", ErrQuota, team, used, max)
	}
	return nil
}

// SnapshotBytes is what team's snapshots take.
func (c *Cluster) SnapshotBytes(ctx context.Context, team string) (int64, error) {
	snaps, err := c.Snapshots(ctx, Owner{Team: team})
	var used int64
	for _, s := range snaps {
		used += s.SizeBytes
	}
	return used, err
}

// TeamHasSnapshotName reports whether team has a snapshot called name.
func (c *Cluster) TeamHasSnapshotName(ctx context.Context, team, name string) (bool, error) {
	_, err := c.cfg.State.Get(ctx, snapshotNameKey(team, name))
	if errors.Is(err, state.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Templates an admin made public are visible to every team (read-only
// for non-admins). The mark is kept in the state store, not in the
// template's description: a template that lives only in the store the
// nodes share can be published without rewriting it.
const publicTemplatePrefix = "template-public/"

// PublicTemplates returns the ids of the public templates.
func (c *Cluster) PublicTemplates(ctx context.Context) (map[string]bool, error) {
	entries, _, err := c.cfg.State.List(ctx, publicTemplatePrefix)
	if err != nil {
		return nil, fmt.Errorf("listing public templates: %w", err)
	}
	out := make(map[string]bool, len(entries))
	for _, e := range entries {
		out[e.Key[len(publicTemplatePrefix):]] = true
	}
	return out, nil
}

// SetTemplatePublic makes template id public or private.
func (c *Cluster) SetTemplatePublic(ctx context.Context, id string, public bool) error {
	var err error
	if public {
		_, err = c.cfg.State.Put(ctx, publicTemplatePrefix+id, nil, state.WriteOptions{})
	} else if err = c.cfg.State.Delete(ctx, publicTemplatePrefix+id, 0); errors.Is(err, state.ErrNotFound) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("marking template %s public=%v: %w", id, public, err)
	}
	c.log.Info("template visibility changed", "template_id", id, "public", public)
	return nil
}

// deleteSnapshotQuietly deletes a snapshot nothing needs any more (what
// names it in the log), in the background: one of the cluster's tasks.
// holders are nodes that may keep a copy of their own (without a store
// the nodes share: the node that took it, those it was moved to).
func (c *Cluster) deleteSnapshotQuietly(id, what string, holders ...string) {
	if id == "" {
		return // nothing was consumed (a migration's resume)
	}
	del := func(ctx context.Context) {
		// Close waits for it rather than cut it short: a snapshot whose
		// delete was cancelled would stay in the store for good.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := c.deleteSnapshotOn(ctx, id, holders); err != nil {
			c.log.Warn("deleting "+what, "snapshot_id", id, "err", err)
		}
	}
	if !c.bg.Go(del) {
		del(context.Background()) // the cluster is closing: at once, here
	}
}

// The snapshot catalog is the store's, which every node shares (without
// a store, the local node's own): any node answers for it.

func (c *Cluster) deleteSnapshot(ctx context.Context, id string) error {
	n, err := c.nodes.any()
	if err != nil {
		return err
	}
	if _, err := n.DeleteSnapshot(ctx, &nodev1.DeleteSnapshotRequest{Id: id}); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", id, err)
	}
	return nil
}

// deleteSnapshotOn deletes snapshot id from the store's catalog and from
// each of holders that has a copy; a holder that is gone or has none is
// passed over.
func (c *Cluster) deleteSnapshotOn(ctx context.Context, id string, holders []string) error {
	if len(holders) == 0 {
		return c.deleteSnapshot(ctx, id)
	}
	first, err := c.nodes.any()
	if err != nil {
		return err
	}
	nodes := []nodeapi.Node{first}
	seen := map[string]bool{first.ID(): true}
	for _, h := range holders {
		if h == "" || seen[h] {
			continue
		}
		seen[h] = true
		if n, err := c.nodes.node(h); err == nil {
			nodes = append(nodes, n) // else its copy went with it
		}
	}
	deleted := false
	var errs []error
	for _, n := range nodes {
		_, err := n.DeleteSnapshot(ctx, &nodev1.DeleteSnapshotRequest{Id: id})
		switch {
		case err == nil:
			deleted = true
		case !errors.Is(err, nodeapi.ErrNotFound):
			errs = append(errs, fmt.Errorf("deleting snapshot %s on node %s: %w", id, n.ID(), err))
		}
	}
	if len(errs) == 0 && !deleted {
		return fmt.Errorf("deleting snapshot %s: %w", id, nodeapi.ErrNotFound)
	}
	return errors.Join(errs...)
}

// snapshots lists the snapshots of the given kinds (all when none).
func (c *Cluster) snapshots(ctx context.Context, kinds ...snapshot.Kind) ([]*snapshot.Snapshot, error) {
	n, err := c.nodes.any()
	if err != nil {
		return nil, err
	}
	req := &nodev1.ListSnapshotsRequest{}
	for _, k := range kinds {
		req.Kinds = append(req.Kinds, string(k))
	}
	resp, err := n.ListSnapshots(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("listing snapshots: %w", err)
	}
	out := make([]*snapshot.Snapshot, len(resp.Snapshots))
	for i, w := range resp.Snapshots {
		out[i] = nodeapi.SnapshotFromWire(w)
	}
	return out, nil
}

// GetSnapshotAny returns a snapshot of any kind by id or name.
func (c *Cluster) GetSnapshotAny(ctx context.Context, idOrName string) (*snapshot.Snapshot, error) {
	n, err := c.nodes.any()
	if err != nil {
		return nil, err
	}
	w, err := n.GetSnapshot(ctx, &nodev1.GetSnapshotRequest{IdOrName: idOrName})
	if errors.Is(err, nodeapi.ErrNotFound) {
		return nil, fmt.Errorf("%w: snapshot %q", ErrNotFound, idOrName)
	}
	if err != nil {
		return nil, fmt.Errorf("looking up snapshot %q: %w", idOrName, err)
	}
	return nodeapi.SnapshotFromWire(w), nil
}

// TemplateUsers counts the sandboxes (running or paused) and snapshots that
// run on template templateID's root filesystem: while there are any, the
// template must not be deleted.
func (c *Cluster) TemplateUsers(ctx context.Context, templateID string) (int, error) {
	n := 0
	c.recs.each(func(r *record) {
		if r.TemplateID == templateID {
			n++
		}
	})
	snaps, err := c.snapshots(ctx)
	if err != nil {
		return 0, err
	}
	for _, s := range snaps {
		// A template's own started service goes with it.
		if s.TemplateID == templateID && s.Kind != snapshot.KindTemplate {
			n++
		}
	}
	return n, nil
}

// DeleteTemplateSnapshots deletes the snapshots of a deleted template's
// started service.
func (c *Cluster) DeleteTemplateSnapshots(ctx context.Context, templateID string) error {
	snaps, err := c.snapshots(ctx, snapshot.KindTemplate)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range snaps {
		if s.TemplateID != templateID {
			continue
		}
		if err := c.deleteSnapshot(ctx, s.ID); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
