package nodeserver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/template"
)

// pullingLocal is a Local that runs pulls only (no node, no builds).
func pullingLocal(t *testing.T, maxPulls int) *Local {
	t.Helper()
	c, err := template.NewCatalog(template.CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &PullConfig{Templates: c, MaxPulls: maxPulls}
	return &Local{opts: LocalOptions{Pulls: cfg}, pulls: newPuller(cfg)}
}

func pullReq(id, ref string) *nodev1.PullRequest {
	return &nodev1.PullRequest{PullId: id, Ref: ref, Template: &nodev1.BuildTemplate{Id: id, Name: id}}
}

// TestPullQueue: pulls past MaxPulls wait on the node, and say so first;
// a waiting pull whose caller leaves ends cancelled, never having reached
// the registry; a pull the registry fails ends with its error's class.
func TestPullQueue(t *testing.T) {
	unblock := make(chan struct{})
	reached := make(chan struct{}, 8)
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached <- struct{}{}
		<-unblock
		http.NotFound(w, r)
	}))
	defer reg.Close()
	l := pullingLocal(t, 1)
	ref := strings.TrimPrefix(reg.URL, "http://") + "/x/y:1"

	first := make(chan *nodev1.PullResult, 1)
	go func() {
		var res *nodev1.PullResult
		err := l.Pull(context.Background(), pullReq("a", ref), func(ev *nodev1.PullEvent) {
			if ev.Result != nil {
				res = ev.Result
			}
		})
		if err != nil {
			t.Error(err)
		}
		first <- res
	}()
	<-reached // the first pull holds the only slot

	ctx, cancel := context.WithCancel(context.Background())
	lines := make(chan string, 8)
	second := make(chan error, 1)
	go func() {
		second <- l.Pull(ctx, pullReq("b", ref), func(ev *nodev1.PullEvent) {
			for _, s := range ev.Lines {
				lines <- s
			}
		})
	}()
	select {
	case line := <-lines:
		if !strings.HasPrefix(line, "queued: 1 pulls run at once") {
			t.Fatalf("the second pull's first line: %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second pull did not say it waits")
	}
	select {
	case <-reached:
		t.Fatal("the second pull reached the registry beside the first")
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	if err := <-second; connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("the waiting pull whose caller left: %v, want cancelled", err)
	}
	close(unblock)
	res := <-first
	if res == nil || res.Error == "" || res.ErrorClass != nodev1.PullResult_ERROR_CLASS_NOT_FOUND {
		t.Fatalf("a pull of a missing image: %v", res)
	}
}

// TestPullRefusals: a client's pull names no file of the node; an
// upload must have arrived first, on a node that takes uploads; a node
// without PullConfig pulls nothing.
func TestPullRefusals(t *testing.T) {
	l := pullingLocal(t, 0)
	noEvents := func(*nodev1.PullEvent) { t.Error("a refused pull sent an event") }
	req := pullReq("c", "oci:/etc")
	req.PublicOnly = true
	if err := l.Pull(context.Background(), req, noEvents); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("a client's pull of a local path: %v", err)
	}
	req = pullReq("d", "")
	req.Source, req.Context = nodev1.PullRequest_SOURCE_OCI, "image"
	if err := l.Pull(context.Background(), req, noEvents); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("an upload on a node without builds: %v", err)
	}
	l.opts.Builds = &BuildConfig{ContextDir: t.TempDir()}
	if err := l.Pull(context.Background(), req, noEvents); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "not received") {
		t.Fatalf("an upload never sent: %v", err)
	}
	if err := l.Pull(context.Background(), pullReq("../e", "x"), noEvents); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a bad pull id: %v", err)
	}
	var none Local
	if err := none.Pull(context.Background(), pullReq("f", "x"), noEvents); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("a node without pulls: %v", err)
	}
}
