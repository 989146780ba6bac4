package envd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
	"github.com/aenvhq/aenv/internal/envd/spec/process/processconnect"
)

// processService implements process.Process; each RPC is in its own
// process_*.go file.
type processService struct {
	s *Server
}

var _ processconnect.ProcessHandler = (*processService)(nil)

// keepaliveHeader asks a stream to emit keepalive events every so many
// seconds, so that proxies do not cut an idle stream.
const keepaliveHeader = "Keepalive-Ping-Interval"

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// keepalive returns a channel that ticks at the interval the client asked
// for (nil, never ticking, when it did not) and a stop function.
func keepalive(h http.Header) (<-chan time.Time, func()) {
	secs, err := strconv.Atoi(strings.TrimSpace(h.Get(keepaliveHeader)))
	if err != nil || secs <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(time.Duration(secs) * time.Second)
	return t.C, t.Stop
}

// forwardEvents streams a process's events to one client until the end
// event, the client leaving, or the request deadline.
func forwardEvents(ctx context.Context, h http.Header, sub *subscriber, send func(*process.ProcessEvent) error) error {
	ka, stop := keepalive(h)
	defer stop()
	kaEvent := &process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetEnd() != nil {
				return nil
			}
		case <-ka:
			if err := send(kaEvent); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("request timeout (Connect-Timeout-Ms) elapsed"))
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}

// processEnv builds a child's environment: envd's own, then the user's
// identity, then the /init variables, then the request's (which win).
func (s *Server) processEnv(u *sysUser, reqEnv map[string]string, withPty bool) []string {
	env := map[string]string{}
	for _, kv := range s.baseEnv {
		if k, v, ok := strings.Cut(kv, "="); ok && k != AccessTokenEnv {
			env[k] = v
		}
	}
	if withPty {
		// envd's own TERM describes no terminal the client has.
		env["TERM"] = "xterm-256color"
	}
	env["HOME"] = u.Home
	env["USER"] = u.Name
	env["LOGNAME"] = u.Name
	env["SHELL"] = u.Shell
	if env["PATH"] == "" {
		env["PATH"] = defaultPath
	}
	maps.Copy(env, s.cfg.env())
	maps.Copy(env, reqEnv)
	delete(env, AccessTokenEnv)
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// workdir picks a process's working directory: the requested one (which
// must exist), else the /init default, else the user's home, else "/".
func (s *Server) workdir(u *sysUser, requested string) (string, error) {
	if requested != "" {
		dir := resolvePath(u, requested)
		if !isDir(dir) {
			return "", fmt.Errorf("choosing working directory: %w: %s is not an existing directory", errInvalid, dir)
		}
		return dir, nil
	}
	if wd := s.cfg.workdir(); wd != "" && isDir(wd) {
		return wd, nil
	}
	if isDir(u.Home) {
		return u.Home, nil
	}
	return "/", nil
}
