package api

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/cluster"
)

// MaxBatch bounds the sandboxes one batch create asks for.
const MaxBatch = 1000

// batchParallelism bounds the creates of one batch in flight at once: the
// nodes queue boots anyway, and a batch must not starve others' creates.
const batchParallelism = 16

// batchBody is a batch create: a create's body, for count sandboxes.
type batchBody struct {
	createBody
	Count int `json:"count"`
	// Atomic makes the batch all or nothing: one failed create removes
	// the others.
	Atomic bool `json:"atomic"`
}

// batchItem is one line of a batch's stream: a sandbox ready, or the
// reason one could not be made.
type batchItem struct {
	Index   int             `json:"index"`
	Sandbox *sandboxJSON    `json:"sandbox,omitempty"`
	Error   *batchErrorJSON `json:"error,omitempty"`
}

type batchErrorJSON struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// batchDone is a batch stream's last line.
type batchDone struct {
	Done    bool `json:"done"`
	Created int  `json:"created"`
	Failed  int  `json:"failed"`
}

// createBatch answers POST /sandboxes/batch, aenv's create of many
// sandboxes in one call (RL steps start environments by the hundred):
// count creates of the same body, placed each on its own, a bounded number
// at a time. By default the answer is a stream (NDJSON): a line per
// sandbox as soon as it is ready or has failed, with the reason, then a
// last line with the counts; a client that leaves stops the creates not
// yet begun (those made are its own, listed as usual, and end with their
// timeouts). With atomic it is all or nothing, answered at once when done:
// 201 with every sandbox, or the first failure's status with every
// sandbox made for the batch removed.
func (s *Handler) createBatch(w http.ResponseWriter, r *http.Request) {
	var body batchBody
	if !decodeBody(w, r, &body) {
		return
	}
	if body.Count < 1 || body.Count > MaxBatch {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("count must be between 1 and %d, got %d", MaxBatch, body.Count))
		return
	}
	if r.Header.Get("Idempotency-Key") != "" {
		writeError(w, http.StatusBadRequest, "Idempotency-Key is not supported for batch creates; a batch's sandboxes are listed under the metadata it gives them")
		return
	}
	req, ok := s.createRequest(w, r, &body.createBody, defaultTimeoutV1)
	if !ok {
		return
	}
	log := s.log.With("template_id", req.TemplateID, "count", body.Count, "atomic", body.Atomic)
	start := time.Now()
	if body.Atomic {
		s.createAtomic(w, r, req, body.Count)
		log.Info("batch create answered", "ms", time.Since(start).Milliseconds())
		return
	}
	es := startEvents(w)
	var mu sync.Mutex
	done := batchDone{Done: true}
	send := func(v any) {
		es.mu.Lock()
		defer es.mu.Unlock()
		if es.err == nil {
			if es.err = es.enc.Encode(v); es.err == nil {
				es.err = es.rc.Flush()
			}
		}
	}
	s.runBatch(r.Context(), req, body.Count, func(i int, sb *cluster.Sandbox, err error) {
		item := batchItem{Index: i}
		mu.Lock()
		if err != nil {
			done.Failed++
			item.Error = &batchErrorJSON{Code: clusterStatus(err), Message: err.Error()}
		} else {
			done.Created++
			js := s.toJSON(sb, false)
			item.Sandbox = &js
		}
		mu.Unlock()
		send(item)
	})
	send(done)
	log.Info("batch create done", "created", done.Created, "failed", done.Failed, "ms", time.Since(start).Milliseconds())
}

// createAtomic is a batch that is all or nothing.
func (s *Handler) createAtomic(w http.ResponseWriter, r *http.Request, req cluster.CreateRequest, count int) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	made := make([]*cluster.Sandbox, count)
	var (
		mu       sync.Mutex
		firstErr error
		failedAt int
	)
	s.runBatch(ctx, req, count, func(i int, sb *cluster.Sandbox, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			made[i] = sb
			return
		}
		if firstErr == nil {
			firstErr, failedAt = err, i
			cancel() // the rest would be removed anyway
		}
	})
	if firstErr == nil {
		out := make([]sandboxJSON, count)
		for i, sb := range made {
			out[i] = s.toJSON(sb, false)
		}
		writeJSON(w, http.StatusCreated, map[string]any{"sandboxes": out})
		return
	}
	// What was made goes, even if the client has left.
	removed := 0
	kctx, kcancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Minute)
	defer kcancel()
	for _, sb := range made {
		if sb == nil {
			continue
		}
		if err := s.cfg.Cluster.Kill(kctx, sb.ID); err != nil {
			s.log.Error("removing a sandbox of a failed atomic batch", "sandbox_id", sb.ID, "err", err)
			continue
		}
		removed++
	}
	err := fmt.Errorf("atomic batch of %d: sandbox %d: %w (the %d made were removed)", count, failedAt, firstErr, removed)
	s.writeClusterError(w, r, err)
}

// runBatch makes count sandboxes of req, batchParallelism at a time, and
// reports each (i is its place in the batch) as it ends. Once ctx ends no
// more creates begin; those not begun are reported with ctx's error.
func (s *Handler) runBatch(ctx context.Context, req cluster.CreateRequest, count int, report func(i int, sb *cluster.Sandbox, err error)) {
	sem := make(chan struct{}, batchParallelism)
	var wg sync.WaitGroup
	for i := range count {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			report(i, nil, fmt.Errorf("%w: the batch was called off before this create began", ctx.Err()))
			continue
		}
		if ctx.Err() != nil {
			<-sem
			report(i, nil, fmt.Errorf("%w: the batch was called off before this create began", ctx.Err()))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			// Each create has its own copy of what it may change.
			one := req
			one.Metadata = maps.Clone(req.Metadata)
			one.EnvVars = maps.Clone(req.EnvVars)
			sb, err := s.create(ctx, one)
			report(i, sb, err)
		}()
	}
	wg.Wait()
}
