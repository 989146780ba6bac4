package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"time"

	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// Volumes are directories on one node each, mounted into the sandboxes
// that name them (which are then placed on that node). Their records are
// in the store: volumes/<id>, and volume-names/<team>/<name> pointing at
// the id, so that a name is unique per team (two teams may each have one
// of a name).
const (
	volumePrefix     = "volumes/"
	volumeNamePrefix = "volume-names/"
)

// validVolumeName is what a volume's name may be.
var validVolumeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Volume is a volume's record.
type Volume struct {
	ID   string `json:"volumeID"`
	Name string `json:"name"`
	// Token authorises its data plane (/volumecontent/...).
	Token  string `json:"token"`
	NodeID string `json:"nodeID"`
	KeyID  string `json:"keyID,omitempty"`
	// Team owns it; a volume from before teams is its key's (TeamID).
	Team      string    `json:"team,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	// Moving is set while the volume moves to another node: no new
	// sandbox may mount it meanwhile.
	Moving bool `json:"moving,omitempty"`
	// SizeBytes bounds its files; 0: a plain directory, unbounded (a
	// volume from before sizes).
	SizeBytes int64 `json:"sizeBytes,omitempty"`
}

// VolumeMount asks for a volume (by name or id) at a path of a sandbox.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// VolumeID is filled in once resolved.
	VolumeID string `json:"volumeID,omitempty"`
}

// TeamID is the team that owns v.
func (v *Volume) TeamID() string {
	if v.Team != "" {
		return v.Team
	}
	return v.KeyID
}

// volumeNameKey is where team's volume name points at its id.
func volumeNameKey(team, name string) string {
	if team == "" {
		team = "_"
	}
	return volumeNamePrefix + team + "/" + name
}

// CreateVolume makes a volume of sizeBytes (0: the node's default) on
// the node with the most room.
func (c *Cluster) CreateVolume(ctx context.Context, owner Owner, name string, sizeBytes int64) (*Volume, error) {
	if !validVolumeName.MatchString(name) {
		return nil, fmt.Errorf("%w: volume name %q: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalid, truncate(name))
	}
	v := &Volume{ID: ids.New(), Name: name, Token: randomToken(), KeyID: owner.KeyID, Team: owner.Team, CreatedAt: time.Now().UTC()}
	nameKey := volumeNameKey(owner.Team, name)
	if _, err := c.cfg.State.Create(ctx, nameKey, []byte(v.ID), state.WriteOptions{}); errors.Is(err, state.ErrExists) {
		return nil, fmt.Errorf("%w: a volume named %q exists", ErrConflict, name)
	} else if err != nil {
		return nil, fmt.Errorf("creating volume %s: %w", name, err)
	}
	fail := func(err error) (*Volume, error) {
		c.cfg.State.Delete(context.WithoutCancel(ctx), nameKey, 0)
		return nil, err
	}
	n, err := c.nodes.place(placement{})
	if err != nil {
		return fail(err)
	}
	res, err := n.CreateVolume(ctx, &nodev1.CreateVolumeRequest{VolumeId: v.ID, SizeBytes: sizeBytes})
	if err != nil {
		return fail(fmt.Errorf("creating volume %s on node %s: %w", name, n.ID(), classifyNodeError(err)))
	}
	v.NodeID, v.SizeBytes = n.ID(), res.SizeBytes
	// The size is known once the node made it (its --volume-size when
	// none was asked for). Two creates at once on two servers may both
	// fit: a bound on bytes the host's disk holds, not on isolation.
	if err := c.withinVolumeQuota(ctx, owner.Team, v.ID, v.SizeBytes); err != nil {
		n.DeleteVolume(context.WithoutCancel(ctx), &nodev1.DeleteVolumeRequest{VolumeId: v.ID})
		return fail(err)
	}
	b, _ := encodeVolume(c.cfg.DataKeys, v)
	if _, err := c.cfg.State.Create(ctx, volumePrefix+v.ID, b, state.WriteOptions{}); err != nil {
		n.DeleteVolume(context.WithoutCancel(ctx), &nodev1.DeleteVolumeRequest{VolumeId: v.ID})
		return fail(fmt.Errorf("recording volume %s: %w", name, err))
	}
	c.log.Info("volume created", "volume_id", v.ID, "name", name, "node_id", v.NodeID)
	return v, nil
}

// withinVolumeQuota refuses volume id of size bytes to a team whose
// volumes would then pass its bound.
func (c *Cluster) withinVolumeQuota(ctx context.Context, team, id string, size int64) error {
	max := c.teamLimits(team).MaxVolumeBytes
	if max <= 0 {
		return nil
	}
	used, err := c.VolumeBytes(ctx, team)
	if err != nil {
		return err
	}
	if used+size > max {
		return fmt.Errorf("%w: team %s's volumes take %d of its %d bytes; volume %s would take %d more", ErrQuota, team, used, max, id, size)
	}
	return nil
}

// VolumeBytes is the size of team's volumes, in all.
func (c *Cluster) VolumeBytes(ctx context.Context, team string) (int64, error) {
	vs, err := c.ListVolumes(ctx, Owner{Team: team})
	var used int64
	for _, v := range vs {
		used += v.SizeBytes
	}
	return used, err
}

// GetVolume returns owner's volume by id.
func (c *Cluster) GetVolume(ctx context.Context, owner Owner, id string) (*Volume, error) {
	v, err := c.volume(ctx, id)
	if err != nil {
		return nil, err
	}
	if !owner.Sees(v.TeamID()) {
		return nil, fmt.Errorf("%w: volume %s", ErrNotFound, id)
	}
	return v, nil
}

// VolumeForData returns volume id for its data plane, whoever owns it
// (the caller checks the volume's token).
func (c *Cluster) VolumeForData(ctx context.Context, id string) (*Volume, error) {
	return c.volume(ctx, id)
}

func (c *Cluster) volume(ctx context.Context, id string) (*Volume, error) {
	e, err := c.cfg.State.Get(ctx, volumePrefix+id)
	if errors.Is(err, state.ErrNotFound) {
		return nil, fmt.Errorf("%w: volume %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("reading volume %s: %w", id, err)
	}
	v, err := decodeVolume(c.cfg.DataKeys, e.Value)
	if err != nil {
		return nil, fmt.Errorf("reading volume %s: %w", id, err)
	}
	return v, nil
}

// encodeVolume stores v with its token sealed with the data key.
func encodeVolume(keys *sealed.Keyring, v *Volume) ([]byte, error) {
	s := *v
	s.Token = keys.Seal(v.Token, volumePrefix+v.ID+"/token")
	return json.Marshal(&s)
}

func decodeVolume(keys *sealed.Keyring, b []byte) (*Volume, error) {
	var v Volume
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	var err error
	if v.Token, err = keys.Open(v.Token, volumePrefix+v.ID+"/token"); err != nil {
		return nil, fmt.Errorf("volume %s's token: %w", v.ID, err)
	}
	return &v, nil
}

// ListVolumes returns owner's volumes, by name.
func (c *Cluster) ListVolumes(ctx context.Context, owner Owner) ([]*Volume, error) {
	entries, _, err := c.cfg.State.List(ctx, volumePrefix)
	if err != nil {
		return nil, fmt.Errorf("listing volumes: %w", err)
	}
	var out []*Volume
	for _, e := range entries {
		v, err := decodeVolume(c.cfg.DataKeys, e.Value)
		if err != nil || !owner.Sees(v.TeamID()) {
			continue
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// DeleteVolume removes owner's volume and its files, unless a sandbox
// (running or paused) mounts it.
func (c *Cluster) DeleteVolume(ctx context.Context, owner Owner, id string) error {
	v, err := c.GetVolume(ctx, owner, id)
	if err != nil {
		return err
	}
	var users []string
	c.recs.each(func(r *record) {
		for _, m := range r.Mounts {
			if m.VolumeID == v.ID {
				users = append(users, r.ID)
			}
		}
	})
	if len(users) > 0 {
		return fmt.Errorf("%w: volume %s is mounted by sandboxes %v; kill them first", ErrConflict, v.Name, users)
	}
	n, err := c.nodes.node(v.NodeID)
	if err != nil {
		return fmt.Errorf("deleting volume %s: its node: %w", v.Name, err)
	}
	if _, err := n.DeleteVolume(ctx, &nodev1.DeleteVolumeRequest{VolumeId: v.ID}); err != nil && !errors.Is(err, nodeapi.ErrNotFound) {
		return fmt.Errorf("deleting volume %s on node %s: %w", v.Name, v.NodeID, err)
	}
	if err := c.cfg.State.Delete(ctx, volumePrefix+v.ID, 0); err != nil && !errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("deleting volume %s: %w", v.Name, err)
	}
	c.cfg.State.Delete(ctx, volumeNameKey(v.TeamID(), v.Name), 0)
	c.log.Info("volume deleted", "volume_id", v.ID, "name", v.Name)
	return nil
}

// resolveMounts finds owner's volumes that mounts name (by name or id)
// and the one node they are all on.
func (c *Cluster) resolveMounts(ctx context.Context, owner Owner, mounts []VolumeMount) ([]VolumeMount, string, error) {
	if len(mounts) == 0 {
		return nil, "", nil
	}
	out := make([]VolumeMount, len(mounts))
	nodeID := ""
	seen := map[string]bool{}
	for i, m := range mounts {
		if !path.IsAbs(m.Path) || path.Clean(m.Path) == "/" {
			return nil, "", fmt.Errorf("%w: volume mount path %q must be absolute and not /", ErrInvalid, truncate(m.Path))
		}
		p := path.Clean(m.Path)
		if seen[p] {
			return nil, "", fmt.Errorf("%w: two volumes mounted at %s", ErrInvalid, p)
		}
		seen[p] = true
		v, err := c.volumeByName(ctx, owner, m.Name)
		if err != nil {
			return nil, "", err
		}
		if v.Moving {
			return nil, "", fmt.Errorf("%w: volume %s is moving to another node with its sandbox; retry in a moment", ErrConflict, v.Name)
		}
		if nodeID != "" && v.NodeID != nodeID {
			return nil, "", fmt.Errorf("%w: volumes %s and %s are on different nodes; one sandbox can mount volumes of one node", ErrInvalid, out[0].Name, v.Name)
		}
		nodeID = v.NodeID
		out[i] = VolumeMount{Name: v.Name, Path: p, VolumeID: v.ID}
	}
	return out, nodeID, nil
}

func (c *Cluster) volumeByName(ctx context.Context, owner Owner, name string) (*Volume, error) {
	e, err := c.cfg.State.Get(ctx, volumeNameKey(owner.Team, name))
	if err == nil {
		return c.volume(ctx, string(e.Value))
	}
	if !errors.Is(err, state.ErrNotFound) {
		return nil, fmt.Errorf("looking up volume %s: %w", name, err)
	}
	// An id works too.
	if v, err := c.GetVolume(ctx, owner, name); err == nil {
		return v, nil
	}
	return nil, fmt.Errorf("%w: volume %q", ErrVolumeNotFound, truncate(name))
}

// ErrVolumeNotFound: a mount names no volume of the caller's.
var ErrVolumeNotFound = errors.New("volume not found")

func mountsToWire(ms []VolumeMount) []*nodev1.VolumeMount {
	var out []*nodev1.VolumeMount
	for _, m := range ms {
		out = append(out, &nodev1.VolumeMount{VolumeId: m.VolumeID, Path: m.Path})
	}
	return out
}

// volumeSharers are the other sandboxes that mount a volume r mounts.
func (c *Cluster) volumeSharers(r *record) []string {
	if len(r.Mounts) == 0 {
		return nil
	}
	mine := map[string]bool{}
	for _, m := range r.Mounts {
		mine[m.VolumeID] = true
	}
	var out []string
	c.recs.each(func(o *record) {
		if o.ID == r.ID {
			return
		}
		for _, m := range o.Mounts {
			if mine[m.VolumeID] {
				out = append(out, o.ID)
				return
			}
		}
	})
	return out
}

// moveVolumes moves the volumes of mounts that are on node from to node
// to, through the store, updating their records; those already on to
// stay.
func (c *Cluster) moveVolumes(ctx context.Context, mounts []VolumeMount, from string, to nodeapi.Node) error {
	for _, m := range mounts {
		v, err := c.volume(ctx, m.VolumeID)
		if err != nil {
			return err
		}
		if v.NodeID == to.ID() || v.NodeID != from {
			continue
		}
		src, err := c.nodes.node(from)
		if err != nil {
			return err
		}
		put := func(v *Volume) error {
			b, _ := encodeVolume(c.cfg.DataKeys, v)
			_, err := c.cfg.State.Put(ctx, volumePrefix+v.ID, b, state.WriteOptions{})
			return err
		}
		v.Moving = true
		if err := put(v); err != nil {
			return fmt.Errorf("moving volume %s: %w", v.Name, err)
		}
		failed := func(err error) error {
			v.Moving = false
			if perr := put(v); perr != nil {
				c.log.Warn("clearing a volume's moving mark", "volume_id", v.ID, "err", perr)
			}
			return err
		}
		if _, err := src.ExportVolume(ctx, &nodev1.ExportVolumeRequest{VolumeId: v.ID}); err != nil {
			return failed(fmt.Errorf("moving volume %s off node %s: %w", v.Name, from, classifyNodeError(err)))
		}
		if _, err := to.ImportVolume(ctx, &nodev1.ImportVolumeRequest{VolumeId: v.ID}); err != nil {
			return failed(fmt.Errorf("moving volume %s to node %s: %w", v.Name, to.ID(), classifyNodeError(err)))
		}
		old := v.NodeID
		v.NodeID, v.Moving = to.ID(), false
		b, _ := encodeVolume(c.cfg.DataKeys, v)
		if _, err := c.cfg.State.Put(ctx, volumePrefix+v.ID, b, state.WriteOptions{}); err != nil {
			return fmt.Errorf("recording volume %s on node %s: %w", v.Name, to.ID(), err)
		}
		if _, err := src.DeleteVolume(ctx, &nodev1.DeleteVolumeRequest{VolumeId: v.ID}); err != nil {
			c.log.Warn("removing a moved volume from its old node", "volume_id", v.ID, "node_id", old, "err", err)
		}
		c.log.Info("volume moved", "volume_id", v.ID, "from", old, "to", to.ID())
	}
	return nil
}
