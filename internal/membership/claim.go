package membership

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/aenvhq/aenv/internal/state"
)

// ErrNodeIDTaken is returned by RegisterNode when another live process
// holds the node id.
var ErrNodeIDTaken = errors.New("node id taken")

// InstancePath is where a node keeps the random part of its instance.
func InstancePath(dataDir string) string { return filepath.Join(dataDir, "node-instance") }

// LoadInstance names this node's process lineage: a random value kept in
// its data directory, and the host's name. A restart of the same node on
// the same host has the same instance and takes its id over at once; a
// second node that claims the id (another host of the same hostname or
// --node-id, or a copy of the data directory on another host) has another.
// Until nodes prove their id with a certificate, a copy of the data
// directory on a host of the same name cannot be told from a restart.
func LoadInstance(dataDir string) (string, error) {
	file := InstancePath(dataDir)
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		v := make([]byte, 16)
		_, _ = rand.Read(v)
		b = []byte(hex.EncodeToString(v))
		if err = os.MkdirAll(dataDir, 0o700); err == nil {
			err = os.WriteFile(file, b, 0o600)
		}
	}
	if err != nil {
		return "", fmt.Errorf("node instance %s: %w", file, err)
	}
	host, _ := os.Hostname()
	return strings.TrimSpace(string(b)) + "@" + host, nil
}

// CheckJoinID checks, before a node of instance is given a certificate
// for id, that no other live instance holds id, as its registration
// would (claimID): ErrNodeIDTaken names the address that holds it. An
// unknown instance (an agent too old to send one) is another instance.
func CheckJoinID(ctx context.Context, st state.Store, id, instance string) error {
	if instance == "" {
		instance = "unknown"
	}
	return claimID(ctx, st, NodeInfo{ID: id, Instance: instance})
}

// claimWait bounds how long a registration watches a record of its id
// left by another instance: a live holder rewrites it every
// ReportInterval, a dead one's lease ends within nodeLeaseTTL.
const claimWait = nodeLeaseTTL + ReportInterval

// claimID checks that no other live instance holds info's id. A record of
// another instance is watched: if it is rewritten, its holder lives and
// the claim fails (ErrNodeIDTaken, naming the address that holds it); if
// it goes (a crashed predecessor's lease ended), the id is free. A record
// without an instance (an older version's) or of this instance is this
// node's own from before a restart.
func claimID(ctx context.Context, st state.Store, info NodeInfo) error {
	if info.Instance == "" {
		return nil
	}
	key := LivePrefix + info.ID
	ents, rev, err := st.List(ctx, key)
	if err != nil {
		return fmt.Errorf("reading the registration of node %s: %w", info.ID, err)
	}
	var held NodeInfo
	for _, e := range ents {
		if e.Key == key {
			if err := json.Unmarshal(e.Value, &held); err != nil {
				return nil // unreadable: not a live holder's
			}
		}
	}
	if held.ID == "" || held.Instance == "" || held.Instance == info.Instance {
		return nil
	}
	taken := fmt.Errorf("%w: node %s is registered and live at %q by another process (instance %s; this one is %s): another host with the same hostname or --node-id, or a copy of this data directory; give this node its own --node-id, or stop the other",
		ErrNodeIDTaken, info.ID, held.Address, held.Instance, info.Instance)
	wctx, cancel := context.WithTimeout(ctx, claimWait)
	defer cancel()
	for ev := range st.Watch(wctx, key, rev) {
		switch {
		case ev.Err != nil:
			return fmt.Errorf("watching the registration of node %s: %w", info.ID, ev.Err)
		case ev.Entry.Key != key:
		case ev.Type == state.EventDelete:
			return nil
		default:
			return taken
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// Neither renewed nor gone within a lease: nothing can be told, and
	// taking a live node's id is the worse mistake.
	return taken
}
