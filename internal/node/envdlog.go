package node

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// envdCursor is how far a sandbox's envd log (runtime.LogReader: up to
// two files, a rotated part and the current one) has been read, and the
// process events read so far, so that each Logs call reads only what envd
// wrote since instead of the whole log again. It is safe for concurrent
// use.
type envdCursor struct {
	mu sync.Mutex
	// dev, ino and head (the file's first bytes) name the file read last:
	// a new file that reuses a removed one's inode is not taken for it.
	dev, ino uint64
	head     []byte
	off      int64
	events   ring[LogEntry]
	last     time.Time
	// from, when set, is the time before which events are not taken.
	from time.Time
}

// skipBefore leaves out the events envd logged before t.
func (c *envdCursor) skipBefore(t time.Time) {
	c.mu.Lock()
	c.from = t
	c.mu.Unlock()
}

// keep takes back events kept of an earlier run of the sandbox here
// (oldest first): a log read afresh from its start takes only later ones.
func (c *envdCursor) keep(events []LogEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range events {
		c.events.add(e, maxLogEntries)
		if e.At.After(c.last) {
			c.last = e.At
		}
	}
}

// headBytes is how much of a file's start tells it from another: envd's
// lines start with a time to the nanosecond.
const headBytes = 64

// advance reads files (oldest first) from where the cursor stands to
// their last whole line, and returns all the events kept.
func (c *envdCursor) advance(files []*os.File) []LogEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	start, from := 0, int64(0)
	found := false
	for i := len(files) - 1; i >= 0; i-- {
		if c.at(files[i]) {
			start, from, found = i, c.off, true
			break
		}
	}
	// Lost track (both files rotated since, or a new log of a sandbox
	// started here again): everything is read, and only events after the
	// last kept one are taken.
	rescan := !found && c.ino != 0
	for i := start; i < len(files); i++ {
		f := files[i]
		if i != start {
			from = 0
		}
		var st syscall.Stat_t
		if fi, err := f.Stat(); err == nil {
			if s, ok := fi.Sys().(*syscall.Stat_t); ok {
				st = *s
			}
			if fi.Size() < from {
				from = 0 // cut short under us: read it again
			}
		}
		if _, err := f.Seek(from, io.SeekStart); err != nil {
			continue
		}
		n := c.scan(f, rescan)
		head := make([]byte, headBytes)
		k, _ := f.ReadAt(head, 0)
		c.dev, c.ino, c.head, c.off = uint64(st.Dev), st.Ino, head[:k], from+n
	}
	return c.events.all()
}

// at reports whether f is the file the cursor stands in.
func (c *envdCursor) at(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || c.ino == 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || uint64(st.Dev) != c.dev || st.Ino != c.ino {
		return false
	}
	head := make([]byte, len(c.head))
	k, _ := f.ReadAt(head, 0)
	return bytes.Equal(head[:k], c.head)
}

// scan takes the events of r's whole lines and returns how many bytes
// they were; a last line without its newline is left for the next time.
// Lines too long for an event are skipped.
func (c *envdCursor) scan(r io.Reader, rescan bool) int64 {
	br := bufio.NewReaderSize(r, 64<<10)
	var n int64
	long := false
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			n += int64(len(line))
			long = true
			continue
		}
		if err != nil {
			// A partial last line is read again once it is whole; one
			// too long for a buffer is past already.
			if long {
				n += int64(len(line))
			}
			return n
		}
		n += int64(len(line))
		if long {
			long = false
			continue
		}
		e, ok := envdEvent(strings.TrimSuffix(string(line), "\n"))
		if !ok || (rescan && !e.At.After(c.last)) || e.At.Before(c.from) {
			continue
		}
		c.events.add(e, maxLogEntries)
		if e.At.After(c.last) {
			c.last = e.At
		}
	}
}

// envdEvent reads a process event from one line of envd's log (log/slog's
// text format).
func envdEvent(line string) (LogEntry, bool) {
	kv := parseSlogText(line)
	msg := kv["msg"]
	if !strings.HasPrefix(msg, "process ") && msg != "initialized" {
		return LogEntry{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, kv["time"])
	if err != nil {
		return LogEntry{}, false
	}
	e := LogEntry{At: at.UTC(), Level: strings.ToLower(kv["level"]), Message: msg, Fields: map[string]string{}}
	for k, v := range kv {
		if k != "time" && k != "level" && k != "msg" {
			e.Fields[k] = v
		}
	}
	return e, true
}
