// Package agent is the node agent, `aenv node`: this host's node (the
// Host: templates, the runtime driver, sandbox networking, snapshots,
// volumes and block images), serving the node API and the sandbox traffic
// that API servers forward to it, and registered in the cluster's node
// registry under a lease. What it shares with the control plane is
// package membership's and the node API's wire (nodeapi); it never
// imports cluster or api, which the layering test enforces. The server
// (package server) opens a Host too, for its in-process node.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// Agent is a running `aenv node`: this host's node, serving the node API
// and the sandbox traffic that API servers forward to it, registered in
// the cluster's registry under a lease.
type Agent struct {
	cfg          Config
	log          *slog.Logger
	state        *state.Etcd
	host         *Host
	http         *http.Server
	listener     net.Listener
	registration *membership.Registration
	advertise    string
	// creds are the node's certificate (nil: it joined with the cluster
	// token and serves plain HTTP).
	creds *nodeCreds
}

// DefaultListen is where a node agent listens unless told otherwise.
const DefaultListen = ":8100"

// Start starts a node agent: it reaches the cluster's etcd (told by
// Config.EtcdEndpoints, or asked of the server at Config.Join), proves it
// holds the cluster token, takes over the sandboxes an earlier process of
// it left running, and serves and registers itself at Config.Advertise.
func Start(ctx context.Context, cfg Config) (_ *Agent, err error) {
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	cfg = cfg.WithDefaults()
	log := cfg.Logger
	a := &Agent{cfg: cfg, log: log}
	defer func() {
		if err != nil {
			a.Close(context.WithoutCancel(ctx))
		}
	}()
	if cfg.InsecureCluster {
		log.Warn(membership.InsecureClusterWarning)
	}
	var token string
	var joined membership.JoinAnswer
	instance, err := membership.LoadInstance(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(cfg.Join, "https://") {
		// The node's certificate is its identity: it holds no cluster token.
		if joined, a.creds, err = joinTLS(ctx, cfg, instance, log); err != nil {
			return nil, err
		}
	} else if token, err = membership.LoadClusterToken(cfg.DataDir, cfg.ClusterToken, false, log); err != nil {
		return nil, err
	} else if cfg.Join != "" {
		if err := membership.CheckPlain("joining with the cluster token", cfg.Join, "join over https with the command 'aenv cluster join-command' prints on a server", cfg.InsecureCluster); err != nil {
			return nil, fmt.Errorf("starting node: %w", err)
		}
		log.Warn("joining over plain HTTP with the cluster token, which anyone on the network can read (as the data key the server hands over): join with the https command `aenv cluster join-command` prints instead", "join", cfg.Join)
		if joined, err = joinCluster(ctx, cfg.Join, token); err != nil {
			return nil, err
		}
	}
	keys, err := membership.LoadDataKeys(cfg.DataDir, cfg.DataKeyFile, false, log)
	if err != nil {
		return nil, err
	}
	if cfg.Join != "" {
		cfg.EtcdEndpoints = joined.EtcdEndpoints
		if keys.Keys == nil && joined.DataKey != "" {
			// Kept in memory only: the next start joins again.
			parsed, err := sealed.ParseKeys(joined.DataKey)
			if err != nil {
				return nil, fmt.Errorf("joining %s: the data key it handed over: %w", cfg.Join, err)
			}
			if keys.Keys, err = sealed.NewKeyring(parsed, nil); err != nil {
				return nil, err
			}
			keys.Where = "the join at " + cfg.Join
		}
	}
	if keys.Keys == nil {
		return nil, fmt.Errorf("starting node: no data key: give --join URL (a server hands it over), --data-key-file or $%s", membership.DataKeyEnv)
	}
	if len(cfg.EtcdEndpoints) == 0 {
		return nil, errors.New("starting node: give --join URL (a server of the cluster) or --etcd-endpoints")
	}
	var stls StateTLS
	if a.creds != nil && cfg.EtcdCertFile == "" && HTTPSEndpoints(cfg.EtcdEndpoints) {
		// The cluster's etcd, served with the cluster's CA: the node's
		// certificate is its etcd user (membership.NodeUser), which
		// writes only this node's keys.
		stls.Client = membership.EtcdClientTLS(a.creds.kp, a.creds.verifier)
	}
	if a.state, err = OpenState(ctx, cfg, stls, log); err != nil {
		return nil, err
	}
	if a.creds == nil {
		if err := membership.CheckToken(ctx, a.state, token, false); err != nil {
			return nil, fmt.Errorf("starting node: %w", err)
		}
	}
	if err := membership.CheckDataKeys(ctx, a.state, keys, false); err != nil {
		return nil, fmt.Errorf("starting node: %w", err)
	}
	if a.creds == nil {
		// Without a certificate the node serves plain HTTP, the cluster
		// token in every request.
		if err := membership.CheckPlain("serving the node API and sandbox traffic", cfg.Listen, "join over https (the command 'aenv cluster join-command' prints) so that the node serves mutual TLS, or listen on loopback", cfg.InsecureCluster); err != nil {
			return nil, fmt.Errorf("starting node: %w", err)
		}
	}
	if a.listener, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listening on %s: %w", cfg.Listen, err)
	}
	if a.advertise, err = Advertised(cfg.Advertise, a.listener.Addr()); err != nil {
		return nil, err
	}
	cfg.Cluster = a.state
	if a.host, err = OpenHost(ctx, cfg, keys.Keys, log); err != nil {
		return nil, err
	}
	a.http = &http.Server{
		Handler:           a.host.NodeHandler(token, log),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	if a.creds != nil {
		a.serveTLS()
	}
	go func() {
		if err := a.http.Serve(a.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving the node API", "err", err)
		}
	}()
	if err := membership.ClearStopping(ctx, a.state, cfg.NodeID); err != nil {
		return nil, err
	}
	if a.registration, err = membership.RegisterNode(ctx, a.state, membership.TLSReporter(a.host.api, a.advertise, instance, a.creds != nil), log); err != nil {
		return nil, err
	}
	a.host.node.OnPoolChange(a.registration.Nudge)
	log.Info("aenv node ready", "node_id", cfg.NodeID, "listen", a.listener.Addr().String(), "advertise", a.advertise,
		"etcd", strings.Join(cfg.EtcdEndpoints, ","), "runtime", a.host.driver.Name(), "runtime_version", a.host.runtimeVersion)
	return a, nil
}

// Advertised is the address servers reach a node at: the flag, else the
// listening address when it names a host (an error when it names every
// address, or the flag is not host:port).
func Advertised(flag string, listen net.Addr) (string, error) {
	if flag != "" {
		if _, _, err := net.SplitHostPort(flag); err != nil {
			return "", fmt.Errorf("--advertise %q: want host:port: %w", flag, err)
		}
		return flag, nil
	}
	host, _, _ := net.SplitHostPort(listen.String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		return "", fmt.Errorf("the node listens on all addresses (%s): give --advertise HOST:PORT, where servers reach it", listen)
	}
	return listen.String(), nil
}

// Addr is the address the agent listens on.
func (a *Agent) Addr() net.Addr { return a.listener.Addr() }

// Host is the agent's host.
func (a *Agent) Host() *Host { return a.host }

// Close stops the agent. Its sandboxes keep running for its next start
// unless Config.OnStop is StopKill; it stays registered until its lease
// expires unless it killed them. With StopPause (--on-stop=drain) it
// first has the cluster move its sandboxes to other nodes (see drain).
func (a *Agent) Close(ctx context.Context) error {
	var errs []error
	if a.cfg.OnStop == membership.StopPause && a.registration != nil {
		a.drain(ctx)
	}
	if a.registration != nil {
		a.registration.Stop()
		if a.cfg.OnStop != membership.StopKeep {
			errs = append(errs, membership.DeregisterNode(ctx, a.state, a.cfg.NodeID))
		}
	}
	if a.http != nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := a.http.Shutdown(sctx); err != nil {
			a.http.Close()
		}
		cancel()
	} else if a.listener != nil {
		a.listener.Close()
	}
	a.creds.close()
	if a.host != nil {
		errs = append(errs, a.host.Close(ctx, a.cfg.OnStop))
	}
	if a.state != nil {
		errs = append(errs, a.state.Close())
	}
	return errors.Join(errs...)
}

// drain marks the node draining and tells the servers it is going away
// (a DRAINING event, repeated in case the elected server was not
// listening), then waits until the cluster has moved every sandbox off it
// (migrated, or paused into the store) or ctx ends.
func (a *Agent) drain(ctx context.Context) {
	if err := membership.MarkStopping(ctx, a.state, a.cfg.NodeID); err != nil {
		a.log.Warn("draining on stop", "err", err)
	}
	a.log.Info("draining: the cluster moves this node's sandboxes away", "node_id", a.cfg.NodeID, "sandboxes", len(a.host.node.List()))
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var announced time.Time
	for len(a.host.node.List()) > 0 {
		if time.Since(announced) > 5*time.Second {
			a.host.api.Publish(&nodev1.Event{Kind: nodev1.Event_KIND_DRAINING})
			announced = time.Now()
		}
		select {
		case <-ctx.Done():
			a.log.Error("draining timed out; the sandboxes left keep running until the node's lease expires",
				"node_id", a.cfg.NodeID, "sandboxes", len(a.host.node.List()))
			return
		case <-tick.C:
		}
	}
	a.log.Info("drained: no sandbox runs here any more", "node_id", a.cfg.NodeID)
}

// joinCluster asks the server at url for the cluster's etcd endpoints.
func joinCluster(ctx context.Context, url, token string) (membership.JoinAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(url, "/")+membership.JoinPath, nil)
	if err != nil {
		return membership.JoinAnswer{}, fmt.Errorf("joining %s: %w", url, err)
	}
	req.Header.Set(nodeapi.TokenHeader, token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return membership.JoinAnswer{}, fmt.Errorf("joining %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct{ Message string }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return membership.JoinAnswer{}, fmt.Errorf("joining %s: the server refused (%d): %s", url, resp.StatusCode, e.Message)
	}
	var ans membership.JoinAnswer
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil || len(ans.EtcdEndpoints) == 0 {
		return membership.JoinAnswer{}, fmt.Errorf("joining %s: no etcd endpoints in the answer (%v)", url, err)
	}
	return ans, nil
}
