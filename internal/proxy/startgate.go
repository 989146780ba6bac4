package proxy

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// processStartPath is envd's Connect procedure that starts a process:
// every command the SDKs run.
const processStartPath = "/process.Process/Start"

// startKey is the context key of a gated request's release func.
type startKey struct{}

// startGate lets a few process starts into this host's sandboxes at a
// time and queues the rest in arrival order. A start holds its slot until
// envd answers (the process is running, its response headers are back),
// the request ends, or startHoldMax passes, whichever is first; the
// process itself runs unbounded.
//
// Why: a burst of first commands (50 pooled sandboxes each running one at
// once, on 2 CPUs) shared the CPUs evenly, so every one of them ended near
// the end of the burst, and each cost more host CPU than alone: 41-60
// CPU-ms per sandbox against 29 with 4 at a time (a client-side limit, on
// this 2-CPU host), the sentries and their stub threads waiting on each
// other across the queue of runnable threads. Served a few at a time, the
// starts end in order, and the burst's median halves.
type startGate struct {
	slots   chan struct{}
	holdMax time.Duration // startHoldMax, but in tests
}

// startHoldMax bounds how long one start keeps its slot: a sandbox slow to
// answer (starved, or stopped) must not hold back the others for long.
const startHoldMax = 250 * time.Millisecond

// startSlots is the number of starts admitted at once: two per CPU, so
// that a start waiting on its sandbox's I/O leaves a CPU to another.
func startSlots() int { return 2 * runtime.NumCPU() }

func newStartGate(n int, holdMax time.Duration) *startGate {
	return &startGate{slots: make(chan struct{}, n), holdMax: holdMax}
}

// enter waits for a slot, or for ctx to end. The release func it returns
// may be called any number of times; the slot is given back once.
func (g *startGate) enter(ctx context.Context) (release func(), err error) {
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var once sync.Once
	free := func() { once.Do(func() { <-g.slots }) }
	timer := time.AfterFunc(g.holdMax, free)
	return func() { timer.Stop(); free() }, nil
}
