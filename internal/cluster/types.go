package cluster

import (
	"errors"
	"log/slog"
	"net/netip"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// Errors the API maps to status codes.
var (
	// ErrNotFound: no such sandbox.
	ErrNotFound = errors.New("sandbox not found")
	// ErrInvalid: the request is malformed or out of range.
	ErrInvalid = errors.New("invalid request")
	// ErrTemplateNotFound: no such template.
	ErrTemplateNotFound = errors.New("template not found")
	// ErrConflict: the sandbox is not in a state that allows the operation.
	ErrConflict = errors.New("conflict")
	// ErrUnsupported: the operation is not available yet.
	ErrUnsupported = errors.New("not supported")
	// ErrUnavailable: the state store cannot be reached; try again later.
	ErrUnavailable = state.ErrUnavailable
	// ErrNoCapacity: no node can take the sandbox now; try again later.
	ErrNoCapacity = errors.New("no capacity")
	// ErrQuota: the caller's key or team has as many sandboxes (or
	// bytes) as it may.
	ErrQuota = errors.New("quota reached")
)

// Owner is who a request acts for: the API key, its team (which owns
// what the request makes) and whether the key is an admin's (which acts
// across teams).
type Owner struct {
	KeyID string
	Team  string
	Admin bool
	// MaxSandboxes bounds the key's running sandboxes (0: no bound);
	// its team's quota comes from Config.TeamLimits.
	MaxSandboxes int
}

// Sees reports whether o may see and act on what team owns: its own
// team's, or anything for an admin.
func (o Owner) Sees(team string) bool { return o.Admin || o.Team == team }

// TeamLimits are a team's bounds the cluster enforces; zero is no bound.
type TeamLimits struct {
	// MaxSandboxes bounds the team's running sandboxes, across servers.
	MaxSandboxes int
	// MaxPaused bounds the paused sandboxes it keeps.
	MaxPaused int
	// MaxVolumeBytes and MaxSnapshotBytes bound the sizes of its volumes
	// and of its snapshots, in all.
	MaxVolumeBytes   int64
	MaxSnapshotBytes int64
}

// State is a sandbox's lifecycle state as E2B names it.
type State string

// States.
const (
	StateRunning State = "running"
	StatePaused  State = "paused"
)

// Limits bound what a client may ask for.
type Limits struct {
	// MaxTimeout is the longest a sandbox may live without a refresh.
	MaxTimeout time.Duration
	// MaxCPUCount and MaxMemoryMB bound one sandbox's resources.
	MaxCPUCount int
	MaxMemoryMB int
	// MaxMetadata bounds the number of metadata entries and env vars.
	MaxMetadata int
}

// DefaultLimits are the limits used when none are configured.
var DefaultLimits = Limits{MaxTimeout: 24 * time.Hour, MaxCPUCount: 8, MaxMemoryMB: 16384, MaxMetadata: 64}

// Config wires a cluster.
type Config struct {
	// Local is the node in this process (the single-host default); nil
	// for a pure API server.
	Local nodeapi.Node
	// Dial reaches the node agent registered at address; nil uses only
	// Local.
	Dial   func(id, address string) nodeapi.Node
	Limits Limits
	// PausedRetention, when positive, is how long a paused sandbox is
	// kept: past it the elected server deletes it and its snapshot, with
	// a log line. Zero keeps paused sandboxes until they are killed.
	PausedRetention time.Duration
	// KilledRetention is how long a killed sandbox's tombstone (whose its
	// logs and metrics are) is kept: as long as the nodes keep its
	// history (0: DefaultKilledRetention). A sandbox that died
	// or was lost keeps its reason for tombstoneTTL.
	KilledRetention time.Duration
	// State holds the records; required.
	State state.Store
	// OnGone, if set, is called after a sandbox is killed, paused, moved
	// or died (reason says why it died), e.g. to cut the proxy's
	// connections to it.
	OnGone func(id, reason string)
	// LegacyStateDir is where servers before the state store kept the
	// records of paused sandboxes (<dir>/paused/*.json); Open moves them
	// into the store once.
	LegacyStateDir string
	// Candidate names this server in the deadline election; it must be
	// unique to one server at a time (a restarted server evicts its dead
	// predecessor by it). Required.
	Candidate string
	// TickInterval is how often the elected server looks for deadlines
	// that passed; 0 means 250ms.
	TickInterval time.Duration
	// TeamLimits returns team's quota; nil bounds no team. It is asked
	// at every create, fork and resume (automatic ones too, which come
	// with no API key), so it must answer from memory.
	TeamLimits func(team string) TeamLimits
	// DataKeys seal the tokens of sandbox and volume records in the
	// store; nil stores them in clear (unit tests).
	DataKeys *sealed.Keyring
	Logger   *slog.Logger
}

// Spec is what a sandbox's creator chose for it, defined once: a
// Sandbox, a CreateRequest and the registration of a fork's child embed
// it, and a fork, resume or migration copies it whole, so that a setting
// added here cannot be dropped by one of the copies.
type Spec struct {
	Metadata map[string]string
	// Timeout is the timeout it was created with, which an automatic
	// resume gives it again.
	Timeout time.Duration
	// AutoPause makes its timeout pause it, not kill it.
	AutoPause bool
	// AutoPauseFilesOnly makes that pause keep only the files (E2B's
	// autoPauseMemory: false).
	AutoPauseFilesOnly bool
	// AutoResume makes traffic to the paused sandbox resume it (with
	// AutoPause: E2B's lifecycle.autoResume).
	AutoResume bool
	// CPUCount and MemoryMB are its resources: in a CreateRequest what
	// is asked for (0: the template's), in a Sandbox what it got.
	CPUCount int
	MemoryMB int
	// AllowInternet is its egress setting, kept so that a resumed sandbox
	// or a fork's children get the same.
	AllowInternet bool
	// Network holds its egress rules (E2B's network.allowOut, CIDRs,
	// addresses and domains, and network.denyOut) and the Host mask of
	// requests to its ports, kept so that a resumed, forked or moved
	// sandbox keeps them. Its AllowInternet is for updates only; the
	// setting is Spec's.
	Network NetworkRules
	// PrivateTraffic makes the sandbox's own ports need its traffic
	// access token (E2B's network.allowPublicTraffic false).
	PrivateTraffic bool
	// Secure makes envd need the sandbox's access token.
	Secure bool
	// Mounts are the volumes it mounts: in a CreateRequest by name or
	// id; in a Sandbox resolved (on its node, which it cannot leave
	// while it has them).
	Mounts []VolumeMount
}

// Sandbox is the control plane's view of a sandbox. Values returned by
// the cluster are copies. It is not what the state store holds: that is
// storedRecord (records.go), converted to and from it.
type Sandbox struct {
	Spec
	ID string
	// TemplateID is the template whose root filesystem it runs on.
	TemplateID string
	// Alias is the name it was created from, when that differs.
	Alias string
	// NodeID is the node it runs on, or was paused on.
	NodeID          string
	State           State
	StartedAt       time.Time
	EndAt           time.Time
	DiskMB          int
	EnvdVersion     string
	EnvdAccessToken string
	// Addr is where the sandbox's ports are reached from its node.
	Addr netip.Addr
	// SnapshotID holds a paused sandbox's state.
	SnapshotID string
	// PausedAt is when it was paused (zero while it runs).
	PausedAt time.Time
	// IdlePaused: the platform paused it for being idle (the node's idle
	// policy), not its owner; its next request resumes it, whatever its
	// AutoResume, with the deadline it had.
	IdlePaused bool
	// KeyID is the API key that created it (for the key's quota).
	KeyID string
	// Team owns it (TeamID says whose a record from before teams is).
	Team string
	// TrafficAccessToken, when set (PrivateTraffic), must come with every
	// request to the sandbox's own ports.
	TrafficAccessToken string
}

// ClientID is E2B's clientID: the node that runs the sandbox. It is
// derived, never stored, so that it follows the sandbox to the node a
// resume or a migration put it on.
func (sb *Sandbox) ClientID() string { return sb.NodeID }

// TeamID is the team that owns the sandbox: its Team, or for a record
// from before teams, the team of its own its key has had since.
func (sb *Sandbox) TeamID() string {
	if sb.Team != "" {
		return sb.Team
	}
	return sb.KeyID
}

// CreateRequest describes a sandbox to create. EnvVars are handed to the
// sandbox and never stored: they are the user's secrets.
type CreateRequest struct {
	Spec
	// TemplateID is the template the node starts from, unless SnapshotID
	// is set (the api resolves the client's names to one or the other).
	TemplateID string
	// SnapshotID, when set, is the snapshot the node starts from instead.
	SnapshotID string
	// Requested is the name the client asked for, kept as the sandbox's
	// alias when it differs.
	Requested string
	EnvVars   map[string]string
	Owner     Owner
	// IdempotencyKey, when set, makes a repeated create (same key, same
	// API key, within IdempotencyTTL) return the first one's sandbox.
	IdempotencyKey string
}
