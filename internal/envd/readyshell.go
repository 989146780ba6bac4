package envd

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// readyShells (nil: off) keeps one login shell started ahead of time for
// the command the SDKs send for every commands.run: `/bin/bash -l -c CMD`,
// as the default user, in the default directory, with the sandbox's environment
// and no stdin. Under gVisor, forking bash, loading it and reading the
// profile cost 8-12 ms of a ~14 ms `true` (measured in a sandbox on a
// 2-core host); a shell that has done all that before the request only
// reads its command and runs it.
//
// The shell must see what a shell started at the request would: the
// profile it read must not have changed since. Every event after which a
// login shell's start-up could read something else (a process envd
// started ends, a file written or moved through envd, /init) makes the
// shell stale; a stale one is killed and a new one started. Changes a
// still-running process makes are not tracked: a command started after
// them is only promised them once that process has ended, as with any
// sequence of commands.
//
// The shell differs from a spawned one only where bash shows how it was
// started: /proc/PID/cmdline is the bootstrap below, BASH_EXECUTION_STRING
// too, a syntax error reads "bash: eval:" rather than "bash: -c:", and the
// last command does not replace bash (bash -c execs a lone simple command).
type readyShells struct {
	s *Server

	mu       sync.Mutex
	gen      uint64         // bumped by every change (see changed)
	sh       *preparedShell // the ready shell, nil when none is
	starting chan struct{}  // closed when the start in progress ends; nil when none runs
	next     *spawnSpec     // what the start in progress launches
	// unwanted is set while the latest login-shell command could not have
	// used a ready shell (it asked for other variables, a directory or a
	// user): none is started until one could again, since each would be
	// killed unused at the next change.
	unwanted bool
	later    *time.Timer // a refill after a quiet period (see changed)
	// dormant is set once no login-shell command has started or ended for
	// readyKeep: the shell is dropped until the next command or /init.
	dormant bool
	idle    *time.Timer
	// idleGen counts the idle timers armed and disarmed: a timer that
	// fires after a later touch or /init finds it moved on (see sleep).
	idleGen   uint64
	idleAfter time.Duration // readyShellIdle, but in tests
	loneAfter time.Duration // readyShellLone, but in tests
	// lastEnd is when the last login-shell command ended, and inSequence
	// whether the latest one started within readyShellSequence of it
	// (see ended).
	lastEnd    time.Time
	inSequence bool
	// pauses are the latest pauses between a login-shell command's end
	// and the next one's start, pauseAt the one the next replaces.
	pauses  [readyShellPauses]time.Duration
	pauseAt int
	closed  bool
}

// preparedShell is a started shell waiting on its script pipe.
type preparedShell struct {
	c    *child
	spec spawnSpec
	gen  uint64 // readyShells.gen when it started
}

// readyBootstrap is what the ready shell runs once its profile is read:
// it reads everything envd writes to its script pipe (fd 3) up to end of
// file, closes the pipe so that nothing the command starts inherits it,
// and evaluates it. envd writes readyHeader's assignments and the command
// on one line, so that the command's line numbers are its own.
//
// Why one read, with -u: each system call of the guest costs ~40 µs of
// host CPU under gVisor here. A `read` without -N takes a pipe a byte per
// call (a header line of its own cost ~32 calls per command), and `<&3`
// saves, redirects and restores fd 0 around each read (~20 more); -N
// reads in chunks and -u reads fd 3 where it is.
const readyBootstrap = `IFS= read -r -N ` + readyReadMax + ` -u 3 __aenv_cmd; exec 3<&-; eval "unset __aenv_cmd; $__aenv_cmd"`

// readyReadMax is the most readyBootstrap reads: readyShellMaxScript and
// readyHeaderMax.
const readyReadMax = "16777728"

// readyHeaderMax bounds readyHeader's length: what the longest host name
// a kernel allows (64 bytes) makes, with room to spare.
const readyHeaderMax = 512

// readyHeader is what envd writes before a command to the ready shell: a
// seed for RANDOM and the current host name (a shell restored from a
// snapshot into another sandbox would repeat the first sandbox's random
// numbers and name), and SECONDS counted from the command.
func readyHeader(seed uint32, host string) string {
	return fmt.Sprintf("RANDOM=%d HOSTNAME='%s' SECONDS=0; ", seed&0x7fffffff, strings.ReplaceAll(host, "'", `'\''`))
}

// readyShellMaxScript bounds the commands the ready shell takes: what
// readyBootstrap reads at most. Larger ones are spawned (bash -c itself
// refuses a single argument over 128 KiB).
const readyShellMaxScript = 16 << 20

// readyShellQuiet is how long after a file change through envd the ready
// shell is started again (see changed).
const readyShellQuiet = 50 * time.Millisecond

// readyShellIdle is how long, by default, a sandbox keeps its ready shell
// after its last login-shell command started or ended, unless its recent
// pauses were longer (see readyKeep). The shell holds ~1.2 MiB of the
// host's memory (its own address space: under systrap, a stub process and
// page tables on the host); an idle sandbox keeps none, and the first
// command after the pause pays a full start, as without it.
const readyShellIdle = 20 * time.Second

// readyShellPauses is how many of the latest pauses between login-shell
// commands readyKeep learns from, and readyShellKeepMax how many times
// the idle period it may keep a shell for (5 minutes by default).
const (
	readyShellPauses  = 4
	readyShellKeepMax = 15
)

// readyShellSequence is how soon after the last login-shell command's end
// the next one must start for the two to be a sequence, whose commands
// each leave a ready shell for the next at once (see ended).
const readyShellSequence = 2 * time.Second

// readyShellLone is how long after a lone command's end (the first after
// a handout, or after a pause longer than readyShellSequence) the next
// ready shell is started. Starting one costs the host 15-20 CPU-ms under
// gVisor: a burst of sandboxes each running one command would otherwise
// start as many shells beside the burst's own work, which 2 cores queue
// (50 pooled creates at once spent a third of their CPU on them). The
// cost of waiting: a second command within this time starts its own
// shell, as it would without a ready one.
const readyShellLone = time.Second

// readyShellWait bounds how long a request waits for a shell that is being
// started for it, rather than spawning its own beside it.
const readyShellWait = 200 * time.Millisecond

// loginShell is the shell the SDKs run every command with.
const loginShell = "/bin/bash"

// take hands out the ready shell for spec, with spec's command written to
// it, when spec is the launch it was started for; else it returns false and
// the caller spawns spec.
func (r *readyShells) take(spec spawnSpec) (*child, bool) {
	if r == nil {
		return nil, false
	}
	script, ok := loginScript(spec)
	if !ok {
		return nil, false
	}
	r.begin()
	r.touch()
	c, ok := r.takeReady(script, spec)
	if !ok {
		// Would a ready shell have served it? The one waiting (current:
		// /init replaces it otherwise) says; without one, the default
		// launch is read again (a passwd read), on a path that spawns
		// anyway.
		r.mu.Lock()
		waiting := r.sh
		r.mu.Unlock()
		var def spawnSpec
		var err error
		if waiting != nil {
			def = waiting.spec
		} else {
			def, err = r.s.readySpec()
		}
		r.mu.Lock()
		r.unwanted = err != nil || !sameLaunch(def, spec)
		r.mu.Unlock()
	}
	return c, ok
}

// takeReady is take once spec is known to be a login shell's.
func (r *readyShells) takeReady(script string, spec spawnSpec) (*child, bool) {
	deadline := time.NewTimer(readyShellWait)
	defer deadline.Stop()
	r.mu.Lock()
	// A start in progress is waited for unless it is known to launch
	// something else.
	for r.sh == nil && r.starting != nil && (r.next == nil || sameLaunch(*r.next, spec)) {
		wait := r.starting
		r.mu.Unlock()
		select {
		case <-wait:
		case <-deadline.C:
			return nil, false
		}
		r.mu.Lock()
	}
	sh := r.sh
	if sh == nil || sh.gen != r.gen || !sameLaunch(sh.spec, spec) {
		r.mu.Unlock()
		return nil, false
	}
	r.sh = nil
	r.mu.Unlock()
	select {
	case <-sh.c.status:
		// It ended before it was asked (a profile that exits, a kill from
		// inside the sandbox): spawn instead.
		sh.close()
		return nil, false
	default:
	}
	// A kernel's host name is at most 64 bytes, so the header fits
	// readyHeaderMax (TestReadyReadMaxHoldsHeaderAndScript).
	seed := make([]byte, 4)
	_, _ = rand.Read(seed)
	host, _ := os.Hostname()
	header := readyHeader(binary.BigEndian.Uint32(seed), host)
	w := sh.c.script
	sh.c.script = nil
	// A command larger than the pipe's buffer is taken in as the shell
	// reads it; the request does not wait for that.
	go func() {
		if _, err := w.WriteString(header + script); err != nil {
			r.s.log.Debug("writing a command to the ready shell", "pid", sh.c.pid, "err", err)
		}
		w.Close()
	}()
	return sh.c, true
}

// loginScript returns spec's command when spec is a login shell's that
// the ready shell could run: `/bin/bash -l -c CMD` with no more arguments,
// no terminal and no stdin.
func loginScript(spec spawnSpec) (string, bool) {
	if len(spec.argv) != 4 || spec.argv[0] != loginShell || spec.argv[1] != "-l" || spec.argv[2] != "-c" ||
		spec.pty != nil || spec.stdin || spec.script {
		return "", false
	}
	script := spec.argv[3]
	if len(script) > readyShellMaxScript || strings.IndexByte(script, 0) >= 0 {
		return "", false
	}
	return script, true
}

// sameLaunch reports whether a shell started as ready would have started
// as want does, argv aside.
func sameLaunch(ready, want spawnSpec) bool {
	return ready.dir == want.dir && ready.switchUser == want.switchUser &&
		ready.user.UID == want.user.UID && ready.user.GID == want.user.GID &&
		slices.Equal(ready.user.Groups, want.user.Groups) && slices.Equal(ready.env, want.env)
}

// changed records that a login shell started now could see something the
// ready one did not: the ready shell is killed, and another started after
// quiet (0: at once), unless the commands sent lately could not use it. A
// process's end refills at once, as the next command of a sequence
// follows it closely; file writes come in bursts, and each would kill the
// shell the one before started.
func (r *readyShells) changed(quiet time.Duration) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.gen++
	old := r.sh
	// A start in progress will start again, maybe launching otherwise.
	r.sh, r.next = nil, nil
	refill := !r.unwanted && !r.closed
	switch {
	case refill && quiet > 0:
		if r.later == nil {
			r.later = time.AfterFunc(quiet, r.refill)
		} else {
			r.later.Reset(quiet)
		}
		refill = false
	case r.later != nil:
		// A refill still to come, armed by a lone command's end, would
		// start a shell while a later command runs, for its end to kill.
		r.later.Stop()
	}
	r.mu.Unlock()
	if old != nil {
		old.kill(r.s.reaper)
	}
	if refill {
		r.refill()
	}
}

// reconfigured records an /init: the sandbox is being handed out, given
// its template's environment in the pool, or resumed, so a dormant one
// gets its ready shell back, and /init may have changed the default launch
// (variables, user, directory): a ready shell started otherwise is
// replaced. One that still matches stays, as after a restore from a
// snapshot whose /init changes only the token.
func (r *readyShells) reconfigured() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.dormant = false
	// Until its next command it waits as one never used does: a pooled
	// sandbox whose pool ran a command in it keeps its shell.
	r.disarmIdleLocked()
	r.mu.Unlock()
	spec, err := r.s.readySpec()
	r.mu.Lock()
	keep := err == nil && ((r.sh != nil && sameLaunch(r.sh.spec, spec)) ||
		(r.sh == nil && r.next != nil && sameLaunch(*r.next, spec)))
	if err == nil {
		r.unwanted = false
	}
	r.mu.Unlock()
	if !keep {
		r.changed(0)
	}
}

// ended records that a process started as spec has ended: a change (see
// changed). When it was a login shell's command in a sequence, the next
// command follows closely and the ready shell is started at once; after a
// lone one, readyShellLone later. Other processes' ends are followed by a
// quiet period like a file change.
func (r *readyShells) ended(spec spawnSpec) {
	if r == nil {
		return
	}
	if _, ok := loginScript(spec); ok {
		r.touch()
		r.changed(r.end())
		return
	}
	r.changed(readyShellQuiet)
}

// begin records a login-shell command starting: whether it is in a
// sequence (see ended), and the pause since the last one ended.
func (r *readyShells) begin() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastEnd.IsZero() {
		r.inSequence = false
		return
	}
	pause := time.Since(r.lastEnd)
	r.inSequence = pause < readyShellSequence
	r.pauses[r.pauseAt] = pause
	r.pauseAt = (r.pauseAt + 1) % readyShellPauses
}

// end records a login-shell command ending and returns how long to wait
// before the next ready shell starts.
func (r *readyShells) end() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastEnd = time.Now()
	if r.inSequence {
		return 0
	}
	return r.loneAfter
}

// touch records a login-shell command starting or ending: the sandbox is
// in use. Other processes (the node's own, with stdin) do not count: a
// prestarted sandbox keeps its shell while it waits in the pool.
func (r *readyShells) touch() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dormant = false
	keep := readyKeep(r.idleAfter, r.pauses[:])
	gen := r.disarmIdleLocked()
	r.idle = time.AfterFunc(keep, func() { r.sleep(gen) })
}

// disarmIdleLocked stops the idle timer, and makes one that is firing
// already do nothing (see sleep); it returns the generation of the next.
func (r *readyShells) disarmIdleLocked() uint64 {
	r.idleGen++
	if r.idle != nil {
		r.idle.Stop()
	}
	return r.idleGen
}

// readyKeep is how long after a login-shell command's start or end the
// ready shell is kept: idle, or twice the longest of the latest pauses
// between commands when that is longer, up to readyShellKeepMax times idle.
//
// Why: an agent's commands come between its model's turns, 5 to 60 s
// apart, past a fixed idle period: each then found no shell and paid a
// full start (45-55 ms against 12-15 ms with one, on the 2-core test
// host). A sandbox that pauses that long once pays it once; one nobody
// uses keeps the shell no longer than its pauses say it might be used.
func readyKeep(idle time.Duration, pauses []time.Duration) time.Duration {
	keep := idle
	for _, p := range pauses {
		keep = max(keep, 2*p)
	}
	return min(keep, readyShellKeepMax*idle)
}

// sleep drops the ready shell of a sandbox nobody has used for readyKeep
// since the touch that armed idle timer gen (see touch); a command or an
// /init since then keeps it.
func (r *readyShells) sleep(gen uint64) {
	r.mu.Lock()
	if gen != r.idleGen {
		r.mu.Unlock()
		return
	}
	r.dormant = true
	r.gen++ // a start in progress is dropped too
	old := r.sh
	r.sh, r.next = nil, nil
	r.mu.Unlock()
	if old != nil {
		old.kill(r.s.reaper)
	}
}

// refill starts a ready shell in the background unless one is ready or
// starting.
func (r *readyShells) refill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.dormant || r.starting != nil || (r.sh != nil && r.sh.gen == r.gen) {
		return
	}
	r.starting = make(chan struct{})
	go r.prepare()
}

// prepare starts ready shells until one starts with no change during its
// start-up, or one cannot start at all.
func (r *readyShells) prepare() {
	for {
		r.mu.Lock()
		gen := r.gen
		if r.closed || r.dormant {
			r.finishLocked()
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		spec, err := r.s.readySpec()
		r.mu.Lock()
		if err == nil && !r.closed && gen != r.gen {
			r.mu.Unlock()
			continue // changed while reading the user's entry
		}
		if err == nil {
			r.next = &spec
		}
		r.mu.Unlock()
		var c *child
		if err == nil {
			c, err = r.s.spawn(spec)
		}
		r.mu.Lock()
		if err != nil || r.closed {
			r.finishLocked()
			r.mu.Unlock()
			if c != nil {
				(&preparedShell{c: c}).kill(r.s.reaper)
			}
			if err != nil {
				r.s.log.Debug("starting a ready shell", "err", err)
			}
			return
		}
		sh := &preparedShell{c: c, spec: spec, gen: gen}
		if gen == r.gen {
			r.sh = sh
			r.finishLocked()
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		sh.kill(r.s.reaper)
	}
}

func (r *readyShells) finishLocked() {
	close(r.starting)
	r.starting, r.next = nil, nil
}

// close kills the ready shell and starts no other.
func (r *readyShells) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.closed = true
	old := r.sh
	r.sh = nil
	for _, t := range []*time.Timer{r.later, r.idle} {
		if t != nil {
			t.Stop()
		}
	}
	r.mu.Unlock()
	if old != nil {
		old.kill(r.s.reaper)
	}
}

// readySpec is the launch a Start request naming no user, directory,
// environment or stdin gets for `/bin/bash -l -c`, running readyBootstrap.
func (s *Server) readySpec() (spawnSpec, error) {
	if err := executable(loginShell); err != nil {
		return spawnSpec{}, fmt.Errorf("no login shell: %w", err)
	}
	u, err := s.resolveUser("")
	if err != nil {
		return spawnSpec{}, err
	}
	switchUser, err := canSwitchUser(u)
	if err != nil {
		return spawnSpec{}, err
	}
	dir, err := s.workdir(u, "")
	if err != nil {
		return spawnSpec{}, err
	}
	return spawnSpec{
		argv:       []string{loginShell, "-l", "-c", readyBootstrap},
		env:        s.processEnv(u, nil, false),
		dir:        dir,
		user:       u,
		switchUser: switchUser,
		script:     true,
	}, nil
}

// kill ends a shell nobody will use and closes envd's ends of its pipes.
// The reaper still collects its status.
func (sh *preparedShell) kill(r *reaper) {
	// An error means it has ended already.
	_ = r.signal(sh.c.pid, syscall.SIGKILL, true)
	sh.close()
}

func (sh *preparedShell) close() {
	if sh.c.script != nil {
		sh.c.script.Close()
	}
	for _, o := range sh.c.outputs {
		o.f.Close()
	}
}
