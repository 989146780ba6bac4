package server

import (
	"net/http"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/console"
	"github.com/aenvhq/aenv/internal/proxy"
	"github.com/aenvhq/aenv/internal/sealed"
)

// withConsole serves the web console in front of h, whose routes then
// take a console session as well as an API key (console.Wrap). Sessions
// are sealed with the cluster's data keys, so that any server of the
// cluster accepts them.
func withConsole(h http.Handler, keys *apikeys.Keys, dataKeys *sealed.Keyring, cfg console.Config) http.Handler {
	cfg.Keys = keys

	cfg.DataKeys = dataKeys
	cfg.Authenticate = api.WithCaller
	cfg.IsSandboxTraffic = func(r *http.Request) bool {
		_, _, ok := proxy.Match(r)
		return ok
	}
	return console.New(cfg).Wrap(h)
}
