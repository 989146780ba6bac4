package membership

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// ServerPrefix holds a record of each running API server, under its
// lease: where it is reached, so that the nodes keep their sandboxes off
// it (see Members). A server's local node is in the node registry too.
const ServerPrefix = "servers/live/"

// serverLeaseTTL is how long a server that stopped renewing stays
// listed.
const serverLeaseTTL = 10 * time.Second

// ServerInfo is what an API server says of itself.
type ServerInfo struct {
	// Name is the server's name in the cluster (its election candidate:
	// hostname and data directory).
	Name string `json:"name"`
	// Addresses are where it is reached: host:port (its API's advertised
	// address, its cluster listener's) or URLs.
	Addresses []string `json:"addresses,omitempty"`
}

// RegisterServer puts info in the registry under a lease and returns once
// it is there; in the background the lease is kept, and taken again when
// it is lost (the store unreachable for longer than its TTL), until Stop,
// which revokes it.
func RegisterServer(ctx context.Context, st state.Store, info ServerInfo, log *slog.Logger) (*Registration, error) {
	b, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("registering server %s: %w", info.Name, err)
	}
	put := func(ctx context.Context) (state.Session, error) {
		sess, err := st.NewSession(context.WithoutCancel(ctx), serverLeaseTTL)
		if err != nil {
			return nil, err
		}
		if _, err := st.Put(ctx, ServerPrefix+info.Name, b, state.WriteOptions{Lease: sess.Lease()}); err != nil {
			sess.Close(context.WithoutCancel(ctx))
			return nil, err
		}
		return sess, nil
	}
	sess, err := put(ctx)
	if err != nil {
		return nil, fmt.Errorf("registering server %s: %w", info.Name, err)
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &Registration{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			select {
			case <-bg.Done():
				cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
				sess.Close(cctx)
				ccancel()
				return
			case <-sess.Done():
			}
			log.Warn("server lease lost; registering again", "server", info.Name)
			for {
				if sess, err = put(bg); err == nil {
					break
				}
				if bg.Err() != nil {
					return
				}
				log.Warn("registering server", "server", info.Name, "err", err)
				sleepCtx(bg, time.Second)
			}
		}
	}()
	return r, nil
}

// ListServers lists the API servers running now, by name.
func ListServers(ctx context.Context, st state.Store) ([]ServerInfo, error) {
	entries, _, err := st.List(ctx, ServerPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing servers: %w", err)
	}
	out := make([]ServerInfo, 0, len(entries))
	for _, e := range entries {
		var info ServerInfo
		if err := json.Unmarshal(e.Value, &info); err != nil {
			continue // not ours to read; the registry's writers are servers
		}
		out = append(out, info)
	}
	return out, nil
}
