package envd

import (
	"crypto/subtle"
	"maps"
	"sync"
	"time"
)

// runtimeConfig is the part of envd's configuration that /init may change
// while it runs.
type runtimeConfig struct {
	mu             sync.RWMutex
	accessToken    string
	defaultUser    string
	defaultWorkdir string
	envVars        map[string]string
	lastInit       time.Time
}

func newRuntimeConfig(token, defaultUser string) *runtimeConfig {
	return &runtimeConfig{accessToken: token, defaultUser: defaultUser, envVars: map[string]string{}}
}

// checkToken reports whether got is acceptable: anything is when no token
// is set.
func (c *runtimeConfig) checkToken(got string) bool {
	c.mu.RLock()
	want := c.accessToken
	c.mu.RUnlock()
	if want == "" {
		return true
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (c *runtimeConfig) token() string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.accessToken
}

func (c *runtimeConfig) user() string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.defaultUser
}

func (c *runtimeConfig) workdir() string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.defaultWorkdir
}

func (c *runtimeConfig) env() map[string]string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return maps.Clone(c.envVars)
}

// initRequest is the body of POST /init. Absent fields leave the current
// setting alone.
type initRequest struct {
	AccessToken    *string           `json:"accessToken,omitempty"`
	EnvVars        map[string]string `json:"envVars,omitempty"`
	DefaultUser    *string           `json:"defaultUser,omitempty"`
	DefaultWorkdir *string           `json:"defaultWorkdir,omitempty"`
	Timestamp      *time.Time        `json:"timestamp,omitempty"`
	// DropAccessToken (aenv's own, not E2B's) removes the token: the node
	// hands a prestarted sandbox, which the pool gave a token while it
	// waited, to a create that asked for none.
	DropAccessToken bool `json:"dropAccessToken,omitempty"`
}

// apply merges req into c. A request older than one already applied is
// ignored (it reports false): the platform may retry /init, and a late
// retry must not undo a newer one.
func (c *runtimeConfig) apply(req initRequest) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if req.Timestamp != nil {
		if !c.lastInit.IsZero() && req.Timestamp.Before(c.lastInit) {
			return false
		}
		c.lastInit = *req.Timestamp
	}
	if req.DropAccessToken {
		c.accessToken = ""
	}
	if req.AccessToken != nil && *req.AccessToken != "" {
		c.accessToken = *req.AccessToken
	}
	maps.Copy(c.envVars, req.EnvVars)
	if req.DefaultUser != nil && *req.DefaultUser != "" {
		c.defaultUser = *req.DefaultUser
	}
	if req.DefaultWorkdir != nil {
		c.defaultWorkdir = *req.DefaultWorkdir
	}
	return true
}
