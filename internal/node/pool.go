package node

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/template"
)

// warmPool keeps sandboxes booted ahead of demand, so that a create only
// has to initialise envd (milliseconds) instead of booting (a runsc start
// is ~170 ms here). Prestarted sandboxes run the template's default
// resources with internet access on; a create that asks for other
// resources boots fresh. One background goroutine refills the pool, one
// sandbox at a time, so refills do not crowd out users' work.
type warmPool struct {
	n         *Node
	size      int
	templates []string

	mu    sync.Mutex
	ready map[string][]*Sandbox // by template id

	kick   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once // starts the refill, or (close) marks it never ran
	done   chan struct{}
}

func newWarmPool(n *Node, size int, templates []string) *warmPool {
	p := &warmPool{n: n, size: size, templates: templates, ready: map[string][]*Sandbox{},
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// start begins prestarting sandboxes. It waits for the node's Start: a
// refill running while Start recovers an earlier process's sandboxes
// would look like one of them.
func (p *warmPool) start() {
	p.once.Do(func() {
		if p.size <= 0 || len(p.templates) == 0 {
			close(p.done)
			return
		}
		go p.refill(p.ctx)
		p.poke()
	})
}

func (p *warmPool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// take returns a prestarted sandbox fitting req, or nil.
func (p *warmPool) take(tpl *template.Template, req CreateRequest) *Sandbox {
	if req.SandboxID != "" ||
		(req.CPUCount != 0 && req.CPUCount != tpl.CPUCount) ||
		(req.MemoryMB != 0 && req.MemoryMB != tpl.MemoryMB) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.ready[tpl.ID]
	if len(list) == 0 {
		return nil
	}
	sb := list[0]
	p.ready[tpl.ID] = list[1:]
	p.poke()
	return sb
}

// memoryMB is the memory the prestarted sandboxes are configured with.
func (p *warmPool) memoryMB() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	total := 0
	for _, list := range p.ready {
		for _, sb := range list {
			total += sb.MemoryMB
		}
	}
	return total
}

// list returns the prestarted sandboxes.
func (p *warmPool) list() []*Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*Sandbox
	for _, l := range p.ready {
		out = append(out, l...)
	}
	return out
}

// remove drops a prestarted sandbox that died; it returns nil if id is not
// in the pool.
func (p *warmPool) remove(id string) *Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	for tpl, list := range p.ready {
		for i, sb := range list {
			if sb.ID == id {
				p.ready[tpl] = slices.Delete(list, i, i+1)
				p.poke()
				return sb
			}
		}
	}
	return nil
}

func (p *warmPool) refill(ctx context.Context) {
	defer close(p.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		for _, id := range p.templates {
			for ctx.Err() == nil {
				p.mu.Lock()
				have := len(p.ready[id])
				p.mu.Unlock()
				if have >= p.size {
					break
				}
				// Boot only while no create is booting: on a small host a
				// refill during a burst slows the burst's own boots more
				// than the pool can help it.
				if !p.waitIdle(ctx) {
					return
				}
				tpl, err := p.n.cfg.Templates.GetLocal(id)
				if err == nil {
					var sb *Sandbox
					if p.n.hasService(tpl) {
						sb, err = p.n.bootService(ctx, NewID(), tpl, netns.SlotOptions{AllowInternet: true})
					} else {
						sb, err = p.n.boot(ctx, NewID(), tpl, bootOptions{Network: netns.SlotOptions{AllowInternet: true}})
					}
					if err == nil {
						p.mu.Lock()
						p.ready[id] = append(p.ready[id], sb)
						p.mu.Unlock()
						continue
					}
				}
				if ctx.Err() == nil && p.n.bg.Err() == nil {
					p.n.log.Warn("prestarting a sandbox failed; retrying in 5s", "template_id", id, "err", err)
					select {
					case <-ctx.Done():
					case <-time.After(5 * time.Second):
					}
				}
			}
		}
	}
}

// waitIdle waits until no sandbox is booting on the node; false if ctx
// ended first.
func (p *warmPool) waitIdle(ctx context.Context) bool {
	for {
		p.n.mu.Lock()
		busy := len(p.n.pending)
		p.n.mu.Unlock()
		if busy == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// close stops refilling and kills every prestarted sandbox.
func (p *warmPool) close(ctx context.Context) error {
	p.cancel()
	p.once.Do(func() { close(p.done) })
	<-p.done
	p.mu.Lock()
	var all []*Sandbox
	for _, list := range p.ready {
		all = append(all, list...)
	}
	p.ready = map[string][]*Sandbox{}
	p.mu.Unlock()
	var errs []error
	for _, sb := range all {
		errs = append(errs, p.n.destroy(ctx, sb))
	}
	return errors.Join(errs...)
}

// poolTake is the warm pool's sandbox for req, unless req mounts volumes.
func (n *Node) poolTake(tpl *template.Template, req CreateRequest) *Sandbox {
	if len(req.Mounts) > 0 {
		return nil
	}
	return n.pool.take(tpl, req)
}
