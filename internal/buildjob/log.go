package buildjob

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// A build's log is kept as chunks of entries under logKeys(buildID), each
// keyed by the index of its first entry (log offsets count from the
// build's first line), at most maxLogBytes of messages in maxLogEntries
// entries in all: past that the oldest chunks go, as the tail says why a
// build failed. A client that polls from an offset already dropped gets
// the tail from its start.
const (
	maxLogBytes   = 1 << 20
	maxLogEntries = 20000
	// A chunk is written once it holds chunkBytes or chunkEntries, or
	// flushEvery after its first entry: a few etcd writes a second at
	// most per build, and a poll sees lines within a second.
	chunkBytes   = 64 << 10
	chunkEntries = 1000
	flushEvery   = 250 * time.Millisecond
	// reasonEntries is how many of the last entries a failure's reason
	// carries.
	reasonEntries = 20
)

func chunkKey(buildID string, first int) string {
	return fmt.Sprintf("%s%012d", logKeys(buildID), first)
}

// Logs returns build buildID's log entries from offset on, at most limit
// of them (negative: all), and the index of the first returned (past
// offset when the entries from offset were dropped).
func (j *Jobs) Logs(ctx context.Context, buildID string, offset, limit int) ([]Entry, int, error) {
	entries, _, err := j.cfg.State.List(ctx, logKeys(buildID))
	if err != nil {
		return nil, 0, fmt.Errorf("reading the log of build %s: %w", buildID, err)
	}
	out, start := []Entry{}, -1
	for i, e := range entries {
		first, err := strconv.Atoi(strings.TrimPrefix(e.Key, logKeys(buildID)))
		if err != nil {
			continue
		}
		// Chunks wholly before offset need not be read.
		if i+1 < len(entries) {
			if next, err := strconv.Atoi(strings.TrimPrefix(entries[i+1].Key, logKeys(buildID))); err == nil && next <= offset {
				continue
			}
		}
		var chunk []Entry
		if err := json.Unmarshal(e.Value, &chunk); err != nil {
			return nil, 0, fmt.Errorf("reading the log of build %s: %w", buildID, err)
		}
		for k, en := range chunk {
			if first+k >= offset {
				if start < 0 {
					start = first + k
				}
				out = append(out, en)
			}
		}
		if limit >= 0 && len(out) >= limit {
			return out[:limit], start, nil
		}
	}
	if start < 0 {
		start = offset
	}
	return out, start, nil
}

// appendChunk adds entries after the log's last, for a build no writer
// follows any more (its failure's message).
func (j *Jobs) appendChunk(ctx context.Context, buildID string, entries []Entry) {
	list, _, err := j.cfg.State.List(ctx, logKeys(buildID))
	if err != nil {
		return
	}
	next := 0
	if n := len(list); n > 0 {
		first, _ := strconv.Atoi(strings.TrimPrefix(list[n-1].Key, logKeys(buildID)))
		var chunk []Entry
		if json.Unmarshal(list[n-1].Value, &chunk) == nil {
			next = first + len(chunk)
		}
	}
	val, _ := json.Marshal(entries)
	j.cfg.State.Create(ctx, chunkKey(buildID, next), val, state.WriteOptions{})
}

func (j *Jobs) deleteLog(ctx context.Context, buildID string) {
	list, _, err := j.cfg.State.List(ctx, logKeys(buildID))
	if err != nil {
		return
	}
	for _, e := range list {
		j.cfg.State.Delete(ctx, e.Key, 0)
	}
}

// logWriter writes a running build's log to the state. One goroutine
// owns the build, but the node's events and the flush timer both reach
// it: it has a lock.
type logWriter struct {
	st      state.KV
	buildID string

	mu sync.Mutex
	// next is the index of the next entry; pending the entries not yet
	// written, from pendingFirst, of pendingBytes.
	next, pendingFirst, pendingBytes int
	pending                          []Entry
	pendingSince                     time.Time
	// chunks are those written and kept, oldest first; bytes and count
	// their sums.
	chunks       []chunkInfo
	bytes, count int
	// tail holds the last entries, for a failure's reason.
	tail []Entry
	err  error
}

type chunkInfo struct{ first, bytes, entries int }

func newLogWriter(st state.KV, buildID string) *logWriter {
	return &logWriter{st: st, buildID: buildID}
}

// add appends an entry per line.
func (w *logWriter) add(ctx context.Context, level string, lines ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now().UTC()
	for _, l := range lines {
		e := Entry{Timestamp: now, Level: level, Message: l}
		if len(w.pending) == 0 {
			w.pendingFirst, w.pendingSince = w.next, now
		}
		w.pending = append(w.pending, e)
		w.pendingBytes += len(l)
		w.next++
		w.tail = append(w.tail, e)
		if len(w.tail) > 2*reasonEntries {
			w.tail = append(w.tail[:0], w.tail[len(w.tail)-reasonEntries:]...)
		}
		if w.pendingBytes >= chunkBytes || len(w.pending) >= chunkEntries {
			w.flushLocked(ctx)
		}
	}
}

// flushIfDue writes the pending entries if they have waited flushEvery.
func (w *logWriter) flushIfDue(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.pending) > 0 && time.Since(w.pendingSince) >= flushEvery {
		w.flushLocked(ctx)
	}
}

func (w *logWriter) flush(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked(ctx)
	return w.err
}

func (w *logWriter) flushLocked(ctx context.Context) {
	if len(w.pending) == 0 {
		return
	}
	val, err := json.Marshal(w.pending)
	if err == nil {
		_, err = w.st.Put(ctx, chunkKey(w.buildID, w.pendingFirst), val, state.WriteOptions{})
	}
	if err != nil {
		// The entries are lost, not the build: its outcome is recorded
		// apart.
		w.err = fmt.Errorf("writing the log of build %s: %w", w.buildID, err)
	}
	w.chunks = append(w.chunks, chunkInfo{first: w.pendingFirst, bytes: w.pendingBytes, entries: len(w.pending)})
	w.bytes += w.pendingBytes
	w.count += len(w.pending)
	w.pending, w.pendingBytes = nil, 0
	for len(w.chunks) > 1 && (w.bytes > maxLogBytes || w.count > maxLogEntries) {
		c := w.chunks[0]
		if err := w.st.Delete(ctx, chunkKey(w.buildID, c.first), 0); err != nil && w.err == nil {
			w.err = fmt.Errorf("dropping the oldest log of build %s: %w", w.buildID, err)
		}
		w.chunks = w.chunks[1:]
		w.bytes -= c.bytes
		w.count -= c.entries
	}
}

// lastEntries are the log's last entries.
func (w *logWriter) lastEntries() []Entry {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Entry(nil), w.tail[max(0, len(w.tail)-reasonEntries):]...)
}
