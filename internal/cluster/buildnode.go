package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/aenvhq/aenv/internal/nodeapi"
)

// BuildNode picks the node a template build runs on: this server's own
// node when it has one that is not draining (the template lands in its
// store, as the server's own templates do), else a random live node this
// server reaches that is not draining. Builds' demands (a step's bounded
// memory and CPUs) are the node's own bounds and slots, which queue what
// does not fit, so the choice weighs no capacity.
func (c *Cluster) BuildNode(ctx context.Context) (nodeapi.Node, error) {
	return c.nodes.builder()
}

func (f *fleet) builder() (nodeapi.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.local != nil && !f.drained[f.local.ID()] {
		return f.local, nil
	}
	var ready []nodeapi.Node
	for id, m := range f.members {
		if m.live && m.api != nil && !f.drained[id] {
			ready = append(ready, m.api)
		}
	}
	if len(ready) == 0 {
		return nil, fmt.Errorf("%w: no node this server reaches is ready to build", ErrNoCapacity)
	}
	return ready[rand.IntN(len(ready))], nil
}
