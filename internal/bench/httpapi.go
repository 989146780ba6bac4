package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// HTTPAPI is the SnapshotAPI of a server, reached through *client.Client
// (REST as the E2B SDKs speak it).
type HTTPAPI struct {
	*client.Client
}

var _ SnapshotAPI = (*HTTPAPI)(nil)

// NewHTTPAPI returns the SnapshotAPI of the server at baseURL.
func NewHTTPAPI(baseURL, key string) *HTTPAPI {
	return &HTTPAPI{Client: client.New(baseURL, key)}
}

// Snapshot implements SnapshotAPI.
func (a *HTTPAPI) Snapshot(ctx context.Context, id string) (SnapshotInfo, error) {
	s, err := a.Client.Snapshot(ctx, id, "")
	if err != nil {
		return SnapshotInfo{}, err
	}
	return SnapshotInfo{SnapshotID: s.SnapshotID, SizeBytes: s.SizeBytes, CPUCount: s.CPUCount, MemoryMB: s.MemoryMB}, nil
}

// DeleteSnapshot implements SnapshotAPI (E2B deletes snapshots through the
// template route).
func (a *HTTPAPI) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	return a.Client.DeleteTemplate(ctx, snapshotID)
}

// Resume implements SnapshotAPI: a connect, which must report that it
// resumed the sandbox (timing a connect to a running one as a resume would
// be wrong).
func (a *HTTPAPI) Resume(ctx context.Context, id string, timeout int) error {
	_, resumed, err := a.Client.Connect(ctx, id, time.Duration(timeout)*time.Second)
	if err != nil {
		return fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	if !resumed {
		return fmt.Errorf("resuming sandbox %s: it was running (HTTP 200), not paused", id)
	}
	return nil
}

// Fork implements SnapshotAPI.
func (a *HTTPAPI) Fork(ctx context.Context, id string, count, timeout int) ([]*client.Sandbox, error) {
	results, err := a.Client.Fork(ctx, id, count, time.Duration(timeout)*time.Second)
	if err != nil {
		return nil, err
	}
	var children []*client.Sandbox
	var errs []error
	for i, r := range results {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("child %d: %w", i+1, r.Err))
			continue
		}
		children = append(children, r.Sandbox)
	}
	if err := errors.Join(errs...); err != nil {
		return children, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	return children, nil
}
