package store

import (
	"container/list"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// chunkCache is the node's local copy of chunks, as stored (encoded) in the
// backend, so that restoring on the host that saved or last restored a
// snapshot needs no network. It is disposable: it may be deleted at any
// time, and every entry is verified by its hash when read, so a torn or
// corrupted file is a miss, never a wrong restore. Files are not fsynced.
//
// Eviction is least-recently-used within maxBytes. Recency survives a
// restart through the files' modification times.
type chunkCache struct {
	dir string
	max int64

	mu      sync.Mutex
	lru     *list.List // of *cacheEntry, front = most recently used
	entries map[string]*list.Element
	size    int64
	// evictions counts entries dropped to stay within max.
	evictions int64
}

type cacheEntry struct {
	hash string
	size int64
}

// touchEvery limits how often a hit rewrites a file's mtime.
const touchEvery = time.Minute

func openChunkCache(dir string, maxBytes int64) (*chunkCache, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &chunkCache{dir: dir, max: maxBytes, lru: list.New(), entries: map[string]*list.Element{}}
	type found struct {
		hash string
		size int64
		mod  time.Time
	}
	var all []found
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if strings.HasPrefix(d.Name(), tmpPrefix) { // left by a crash
			os.Remove(p)
			return nil
		}
		if !isHash(d.Name()) {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		all = append(all, found{d.Name(), fi.Size(), fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mod.After(all[j].mod) })
	for _, f := range all {
		c.entries[f.hash] = c.lru.PushBack(&cacheEntry{hash: f.hash, size: f.size})
		c.size += f.size
	}
	c.mu.Lock()
	c.evictLocked()
	c.mu.Unlock()
	return c, nil
}

func (c *chunkCache) path(hash string) string {
	return filepath.Join(c.dir, hash[:2], hash)
}

// get returns the cached bytes of hash, or false.
func (c *chunkCache) get(hash string) ([]byte, bool) {
	p := c.path(hash)
	data, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			c.forget(hash)
		}
		return nil, false
	}
	c.mu.Lock()
	if e, ok := c.entries[hash]; ok {
		c.lru.MoveToFront(e)
	} else { // written by another process sharing the directory
		c.entries[hash] = c.lru.PushFront(&cacheEntry{hash: hash, size: int64(len(data))})
		c.size += int64(len(data))
		c.evictLocked()
	}
	c.mu.Unlock()
	if fi, err := os.Stat(p); err == nil && time.Since(fi.ModTime()) > touchEvery {
		now := time.Now()
		os.Chtimes(p, now, now)
	}
	return data, true
}

// has reports whether hash is believed to be cached.
func (c *chunkCache) has(hash string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.entries[hash]
	return ok
}

// put stores data under hash. Failures are ignored: the cache only saves
// time. Room is made for the chunk before its file is written, so that
// puts running side by side (a mount's readahead fetches several chunks
// at once) never take the disk past the bound, even for a moment.
func (c *chunkCache) put(hash string, data []byte) {
	size := int64(len(data))
	if size > c.max {
		return
	}
	c.mu.Lock()
	if e, ok := c.entries[hash]; ok {
		c.lru.MoveToFront(e)
		c.mu.Unlock()
		return
	}
	c.size += size
	c.evictLocked()
	c.mu.Unlock()
	err := writeFileAtomic(c.path(hash), data)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[hash]; ok || err != nil { // failed, or a concurrent put won
		c.size -= size
		if ok {
			c.lru.MoveToFront(e)
		}
		return
	}
	c.entries[hash] = c.lru.PushFront(&cacheEntry{hash: hash, size: size})
}

// forget drops hash, e.g. after its file failed verification.
func (c *chunkCache) forget(hash string) {
	c.mu.Lock()
	if e, ok := c.entries[hash]; ok {
		c.removeLocked(e)
	}
	c.mu.Unlock()
	os.Remove(c.path(hash))
}

func (c *chunkCache) evictLocked() {
	for c.size > c.max {
		e := c.lru.Back()
		if e == nil {
			return
		}
		c.removeLocked(e)
		c.evictions++
		os.Remove(c.path(e.Value.(*cacheEntry).hash))
	}
}

func (c *chunkCache) removeLocked(e *list.Element) {
	ce := c.lru.Remove(e).(*cacheEntry)
	delete(c.entries, ce.hash)
	c.size -= ce.size
}

// usage reports the cache's accounted size in bytes.
func (c *chunkCache) usage() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size
}

// CacheStats describes a Repository's local chunk cache.
type CacheStats struct {
	// Bytes is what the cache holds, within MaxBytes.
	Bytes, MaxBytes int64
	// Hits and Misses count chunk reads served from it or not (then
	// fetched from the backend); Evictions counts chunks dropped to stay
	// within MaxBytes.
	Hits, Misses, Evictions int64
}

// CacheStats reports the local chunk cache's figures (all zero without
// one).
func (s *Repository) CacheStats() CacheStats {
	if s.cache == nil {
		return CacheStats{}
	}
	s.cache.mu.Lock()
	defer s.cache.mu.Unlock()
	return CacheStats{Bytes: s.cache.size, MaxBytes: s.cache.max, Hits: s.hits.Load(), Misses: s.misses.Load(), Evictions: s.cache.evictions}
}

// writeFileAtomic writes data to p through a temporary file and a rename,
// creating p's directory if the cache was removed underneath us.
func writeFileAtomic(p string, data []byte) error {
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, tmpPrefix+"*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

func isHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, r := range s {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}
