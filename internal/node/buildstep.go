package node

import (
	"context"
	"fmt"
	"io"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/runtime"
)

// RunStep runs one step of a template build through the node's runtime
// driver, like any sandbox of this node (see runtime.Stepper), with the
// egress of a sandbox whose internet is open (unless the node builds
// without network): a network slot of its own, released after the step.
// A step that sets no pids limit gets the node's sandboxes'.
func (n *Node) RunStep(ctx context.Context, spec runtime.StepSpec, out io.Writer) (int, error) {
	st, ok := n.cfg.Runtime.(runtime.Stepper)
	if !ok {
		return -1, fmt.Errorf("running build step: runtime %s: %w", n.cfg.Runtime.Name(), ErrUnsupported)
	}
	if spec.PidsLimit <= 0 {
		spec.PidsLimit = n.cfg.PidsLimit
	}
	if !n.cfg.BuildWithoutNetwork {
		slot, err := n.cfg.Network.Acquire(ctx, netns.SlotOptions{AllowInternet: true})
		if err != nil {
			return -1, fmt.Errorf("running build step: its network: %w", err)
		}
		defer n.cfg.Network.Release(context.WithoutCancel(ctx), slot)
		spec.NetNSPath, spec.DNSServers = slot.SandboxNSPath, n.cfg.DNSServers
	}
	return st.RunStep(ctx, spec, out)
}
