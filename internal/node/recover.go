package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/sealed"
)

// localRecord is what the node keeps on this host of each sandbox it
// hands out, so that a restarted node process can take the sandbox over
// (see Recover): the parts that only this host knows, like which network
// slot the sandbox runs in. It lives in the run directory because it means
// nothing once the host reboots, and neither do the sandboxes.
type localRecord struct {
	ID              string            `json:"id"`
	TemplateID      string            `json:"templateID"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskMB          int               `json:"diskMB"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Addr            netip.Addr        `json:"addr"`
	StartedAt       time.Time         `json:"startedAt"`
	Slot            string            `json:"slot"`
	Egress          netns.SlotOptions `json:"egress"`
	RootImage       string            `json:"rootImage,omitempty"`
	Team            string            `json:"team,omitempty"`
	// RuntimeID is its name to the runtime where that is not ID
	// (Sandbox.rt).
	RuntimeID string `json:"runtimeID,omitempty"`
}

// rt is the record's sandbox's name to the runtime.
func (r *localRecord) rt() string {
	if r.RuntimeID != "" {
		return r.RuntimeID
	}
	return r.ID
}

// recordTokenAAD binds a sealed token to its sandbox's record, so that it
// opens in no other.
func recordTokenAAD(id string) string { return "node-records/" + id + "/envdAccessToken" }

func (n *Node) recordPath(id string) string {
	return filepath.Join(n.cfg.StateDir, "sandboxes", id+".json")
}

// saveRecord writes sb's local record; without a StateDir the node keeps
// none and its sandboxes die with it.
func (n *Node) saveRecord(sb *Sandbox) error {
	if n.cfg.StateDir == "" {
		return nil
	}
	token := sb.EnvdAccessToken
	if n.cfg.Keys != nil && token != "" {
		token = n.cfg.Keys.Seal(token, recordTokenAAD(sb.ID))
	}
	rec := localRecord{
		ID: sb.ID, TemplateID: sb.TemplateID, CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB,
		DiskMB: sb.DiskMB, EnvdVersion: sb.EnvdVersion, EnvdAccessToken: token,
		Addr: sb.Addr, StartedAt: sb.StartedAt, Slot: sb.slot.Name, Egress: sb.egress,
		RootImage: sb.RootImage, Team: sb.Team, RuntimeID: sb.runtimeID,
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	p := n.recordPath(sb.ID)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("saving record of %s: %w", sb.ID, err)
	}
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("saving record of %s: %w", sb.ID, err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		return fmt.Errorf("saving record of %s: %w", sb.ID, err)
	}
	return nil
}

func (n *Node) removeRecord(id string) {
	if n.cfg.StateDir != "" {
		os.Remove(n.recordPath(id))
	}
}

// recoverProbeTimeout bounds the health check of a recovered sandbox's
// envd: one that does not answer that fast is not worth keeping.
const recoverProbeTimeout = 3 * time.Second

// Start takes over the sandboxes an earlier process of this node left
// running on the host (after a restart, an upgrade or a kill -9), then
// starts prestarting sandboxes. Each earlier sandbox with a local record
// gets its network slot and its runtime watch back and must answer on
// envd; the others, and what is left of sandboxes that died meanwhile,
// are removed. It returns the sandboxes it kept, which the caller
// reconciles with the control plane's records. Call it once, before the
// first Create.
func (n *Node) Start(ctx context.Context) ([]*Sandbox, error) {
	kept, err := n.recover(ctx)
	n.pool.start()
	return kept, err
}

func (n *Node) recover(ctx context.Context) ([]*Sandbox, error) {
	rec, ok := n.cfg.Runtime.(runtime.Recoverer)
	if !ok {
		return nil, nil
	}
	ids, err := rec.Leftovers(ctx)
	if err != nil {
		return nil, fmt.Errorf("recovering sandboxes: %w", err)
	}
	records := n.readRecords()
	var kept []*Sandbox
	seen := map[string]bool{}
	for _, id := range ids {
		seen[id] = true
		lr := records[id]
		sb, err := n.recoverOne(ctx, rec, id, lr)
		if err != nil {
			n.log.Warn("sandbox of an earlier run not recovered; removing it", "sandbox_id", id, "err", err)
			if lr != nil {
				n.removeRecord(lr.ID)
			}
			if kerr := n.cfg.Runtime.Kill(ctx, id); kerr != nil && !errors.Is(kerr, runtime.ErrNotFound) {
				n.log.Warn("removing unrecovered sandbox", "sandbox_id", id, "err", kerr)
			}
			continue
		}
		kept = append(kept, sb)
	}
	// Records of sandboxes the runtime no longer has at all.
	for rtID, lr := range records {
		if !seen[rtID] {
			n.removeRecord(lr.ID)
		}
	}
	if err := n.cfg.Network.ReleaseLeftovers(ctx); err != nil {
		n.log.Warn("releasing network slots of gone sandboxes", "err", err)
	}
	// The images of sandboxes that did not survive are let go of.
	live := make([]string, 0, len(kept))
	for _, sb := range kept {
		live = append(live, sb.rt())
	}
	if err := n.cfg.RootFS.Sync(ctx, live); err != nil {
		n.log.Warn("releasing the root filesystems of gone sandboxes", "err", err)
	}
	if len(ids) > 0 {
		n.log.Info("recovered sandboxes of an earlier run", "recovered", len(kept), "removed", len(ids)-len(kept))
	}
	return kept, nil
}

// readRecords reads the local records, by the sandboxes' names to the
// runtime (the leftovers it lists); one that does not parse is removed.
func (n *Node) readRecords() map[string]*localRecord {
	out := map[string]*localRecord{}
	if n.cfg.StateDir == "" {
		return out
	}
	files, _ := filepath.Glob(filepath.Join(n.cfg.StateDir, "sandboxes", "*.json"))
	for _, f := range files {
		var lr localRecord
		b, err := os.ReadFile(f)
		if err == nil {
			err = json.Unmarshal(b, &lr)
		}
		if err != nil || lr.ID == "" {
			n.log.Warn("removing a local record that cannot be read", "file", f, "err", err)
			os.Remove(f)
			continue
		}
		out[lr.rt()] = &lr
	}
	return out
}

// recoverOne takes over leftover id (the runtime's name), whose local
// record is lr (nil: none); on error the caller removes it, and the slot
// (if adopted) is released here.
func (n *Node) recoverOne(ctx context.Context, rec runtime.Recoverer, id string, lr *localRecord) (_ *Sandbox, err error) {
	if n.cfg.StateDir == "" {
		return nil, errors.New("this node keeps no local records")
	}
	if lr == nil {
		return nil, errors.New("no local record (a create or a pause was cut short)")
	}
	token := lr.EnvdAccessToken
	if sealed.IsSealed(token) {
		if n.cfg.Keys == nil {
			return nil, errors.New("its local record's envd token is sealed, and this node has no data key")
		}
		if token, err = n.cfg.Keys.Open(token, recordTokenAAD(lr.ID)); err != nil {
			return nil, fmt.Errorf("opening its local record's envd token: %w", err)
		}
	}
	slot, err := n.cfg.Network.Adopt(lr.Slot)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.cfg.Network.Release(context.WithoutCancel(ctx), slot)
		}
	}()
	if err := rec.Recover(ctx, id); err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, recoverProbeTimeout)
	defer cancel()
	if err := newEnvdClient(slot.HostAddr, "").waitReady(pctx, nil); err != nil {
		return nil, fmt.Errorf("envd does not answer: %w", err)
	}
	sb := &Sandbox{
		ID: lr.ID, TemplateID: lr.TemplateID, CPUCount: lr.CPUCount, MemoryMB: lr.MemoryMB,
		DiskMB: lr.DiskMB, EnvdVersion: lr.EnvdVersion, EnvdAccessToken: token,
		Addr: slot.HostAddr, StartedAt: lr.StartedAt, slot: slot, egress: lr.Egress,
		RootImage: lr.RootImage, Team: lr.Team, runtimeID: lr.RuntimeID,
	}
	sb.cpuAt = time.Now()
	if st, err := n.cfg.Runtime.Stats(ctx, id); err == nil {
		sb.cpuBase = st.CPUUsageNanos
	}
	n.mu.Lock()
	n.sandboxes[sb.ID] = sb
	n.mu.Unlock()
	n.log.Info("sandbox recovered", "sandbox_id", sb.ID, "runtime_id", id, "slot", slot.Name)
	return sb, nil
}
