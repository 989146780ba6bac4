package testutil

import (
	"errors"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// endLockedThreads makes the Go runtime end n OS threads, as code that
// forks from a thread of its own does.
func endLockedThreads(n int) {
	for range n {
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(done)
		}()
		<-done
	}
}

var errMainThread = errors.New("on the main thread")

func alive(cmd *exec.Cmd) bool { return cmd.Process.Signal(syscall.Signal(0)) == nil }

// TestStartTiedOutlivesEndedThreads: a child started with a parent-death
// signal from a thread that then ends is killed (what broke tests that
// started servers), while one StartTied starts lives on until killed.
func TestStartTiedOutlivesEndedThreads(t *testing.T) {
	// The hazard: fork from a locked thread that ends. (The runtime
	// never ends the main thread: a goroutine that finds itself there
	// lets go and the next one tries.)
	naive := exec.Command("sleep", "30")
	naive.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	for {
		started := make(chan error)
		go func() {
			runtime.LockOSThread()
			if syscall.Gettid() == syscall.Getpid() {
				runtime.UnlockOSThread()
				started <- errMainThread
				return
			}
			started <- naive.Start()
		}()
		err := <-started
		if err == errMainThread {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		break
	}
	naiveDone := make(chan struct{})
	go func() { naive.Wait(); close(naiveDone) }()
	select {
	case <-naiveDone:
	case <-time.After(10 * time.Second):
		naive.Process.Kill()
		t.Fatal("a child forked from an ended thread outlived it: the premise does not hold")
	}

	cmd := exec.Command("sleep", "30")
	done, err := StartTied(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		<-done
	}()
	endLockedThreads(20)
	time.Sleep(200 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("the tied child died when other threads ended")
	default:
	}
	if !alive(cmd) {
		t.Fatal("the tied child is gone")
	}
	cmd.Process.Kill()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("done not closed after the child was killed")
	}
}
