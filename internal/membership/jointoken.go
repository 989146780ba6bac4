package membership

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// JoinTokenPrefix holds the join tokens (JoinTokenRecord by id). Only a
// hash of each token's secret is stored: reading the state does not
// give a token away.
const JoinTokenPrefix = "cluster/join-tokens/"

// DefaultJoinTokenTTL is how long a join token lasts unless told.
const DefaultJoinTokenTTL = time.Hour

// ErrInvalidJoinToken: a join token that is malformed, unknown, revoked,
// expired, or whose secret is wrong. Which of these is not told to the
// caller (it would help a guesser), only logged.
var ErrInvalidJoinToken = errors.New("invalid join token")

// joinTokenPattern is kubeadm's bootstrap token form, <id>.<secret>: the
// id names the record, the secret proves the holder.
var joinTokenPattern = regexp.MustCompile(`^([a-z0-9]{6})\.([a-z0-9]{16})$`)

// JoinTokenRecord is a join token as stored.
type JoinTokenRecord struct {
	ID string `json:"id"`
	// SecretSHA256 is the hex SHA-256 of the secret.
	SecretSHA256 string `json:"secretSha256"`
	Description  string `json:"description,omitempty"`
	// Role is what the token joins: JoinNode (also a record without
	// one, from before servers joined) or JoinServer.
	Role      JoinRole  `json:"role,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// JoinRole is what a join token joins. A server's join is handed the
// CA's key and the data key; a node's only its own certificate. A token
// joins only its role, so that a node's token, the one handed out most
// often, never yields the CA's key.
type JoinRole string

const (
	// JoinNode tokens join node agents (`aenv node --join`).
	JoinNode JoinRole = "node"
	// JoinServer tokens join API servers (`aenv server --join`).
	JoinServer JoinRole = "server"
)

// ErrJoinTokenRole: a valid join token given for the other role's join.
var ErrJoinTokenRole = errors.New("join token of another role")

// JoinTokenSpec is what a new join token is: its life (0:
// DefaultJoinTokenTTL), its description and its role ("": JoinNode).
type JoinTokenSpec struct {
	TTL         time.Duration
	Description string
	Role        JoinRole
}

// CreateJoinToken makes a join token of spec and returns it whole: the
// only time its secret is seen.
func CreateJoinToken(ctx context.Context, st state.Store, spec JoinTokenSpec, now time.Time) (string, JoinTokenRecord, error) {
	ttl := spec.TTL
	if ttl <= 0 {
		ttl = DefaultJoinTokenTTL
	}
	role := spec.Role
	if role == "" {
		role = JoinNode
	}
	if role != JoinNode && role != JoinServer {
		return "", JoinTokenRecord{}, fmt.Errorf("creating a join token: unknown role %q", role)
	}
	for range 5 {
		id, secret := randomToken(6), randomToken(16)
		rec := JoinTokenRecord{ID: id, SecretSHA256: secretHash(secret), Description: spec.Description, Role: role,
			CreatedAt: now.UTC(), ExpiresAt: now.Add(ttl).UTC()}
		b, _ := json.Marshal(rec)
		_, err := st.Create(ctx, JoinTokenPrefix+id, b, state.WriteOptions{})
		if errors.Is(err, state.ErrExists) {
			continue
		}
		if err != nil {
			return "", JoinTokenRecord{}, fmt.Errorf("creating a join token: %w", err)
		}
		return id + "." + secret, rec, nil
	}
	return "", JoinTokenRecord{}, errors.New("creating a join token: no free id")
}

// CheckJoinToken accepts token for a join of role if it is the
// cluster's, unrevoked and unexpired at now; otherwise
// ErrInvalidJoinToken, wrapped with the reason for the log. A valid token
// of the other role is ErrJoinTokenRole.
func CheckJoinToken(ctx context.Context, st state.Store, token string, role JoinRole, now time.Time) (JoinTokenRecord, error) {
	m := joinTokenPattern.FindStringSubmatch(strings.TrimSpace(token))
	if m == nil {
		return JoinTokenRecord{}, fmt.Errorf("%w: not of the form <6 characters>.<16 characters>", ErrInvalidJoinToken)
	}
	e, err := st.Get(ctx, JoinTokenPrefix+m[1])
	if errors.Is(err, state.ErrNotFound) {
		return JoinTokenRecord{}, fmt.Errorf("%w: token %s is unknown or revoked", ErrInvalidJoinToken, m[1])
	}
	if err != nil {
		return JoinTokenRecord{}, fmt.Errorf("checking join token %s: %w", m[1], err)
	}
	var rec JoinTokenRecord
	if err := json.Unmarshal(e.Value, &rec); err != nil {
		return JoinTokenRecord{}, fmt.Errorf("%w: token %s's record is unreadable", ErrInvalidJoinToken, m[1])
	}
	if subtle.ConstantTimeCompare([]byte(secretHash(m[2])), []byte(rec.SecretSHA256)) != 1 {
		return JoinTokenRecord{}, fmt.Errorf("%w: token %s's secret is wrong", ErrInvalidJoinToken, m[1])
	}
	if !now.Before(rec.ExpiresAt) {
		return JoinTokenRecord{}, fmt.Errorf("%w: token %s expired at %s", ErrInvalidJoinToken, m[1], rec.ExpiresAt.Format(time.RFC3339))
	}
	if rec.Role == "" {
		rec.Role = JoinNode
	}
	if rec.Role != role {
		return JoinTokenRecord{}, fmt.Errorf("%w: token %s joins a %s, not a %s", ErrJoinTokenRole, m[1], rec.Role, role)
	}
	return rec, nil
}

// UseJoinToken uses up join token id (the part before the dot, or the
// whole token), which CheckJoinToken accepted, for a join that must be
// its only one: a server's, which is handed the CA's key. Of two joins
// racing with one token, one uses it and the other gets
// ErrInvalidJoinToken. Restore puts it back for a join that failed after.
func UseJoinToken(ctx context.Context, st state.Store, id string) (restore func(context.Context) error, err error) {
	id, _, _ = strings.Cut(id, ".")
	e, err := st.Get(ctx, JoinTokenPrefix+id)
	if errors.Is(err, state.ErrNotFound) {
		return nil, fmt.Errorf("%w: token %s is used, unknown or revoked", ErrInvalidJoinToken, id)
	}
	if err != nil {
		return nil, fmt.Errorf("using join token %s: %w", id, err)
	}
	switch err := st.Delete(ctx, e.Key, e.Revision); {
	case errors.Is(err, state.ErrNotFound) || errors.Is(err, state.ErrConflict):
		return nil, fmt.Errorf("%w: token %s was used by another join", ErrInvalidJoinToken, id)
	case err != nil:
		return nil, fmt.Errorf("using join token %s: %w", id, err)
	}
	return func(ctx context.Context) error {
		if _, err := st.Create(ctx, e.Key, e.Value, state.WriteOptions{}); err != nil {
			return fmt.Errorf("restoring join token %s: %w", id, err)
		}
		return nil
	}, nil
}

// ListJoinTokens lists the join tokens not yet expired at now, soonest
// to expire first, and removes the expired ones.
func ListJoinTokens(ctx context.Context, st state.Store, now time.Time) ([]JoinTokenRecord, error) {
	ents, _, err := st.List(ctx, JoinTokenPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing join tokens: %w", err)
	}
	out := []JoinTokenRecord{}
	for _, e := range ents {
		var rec JoinTokenRecord
		if json.Unmarshal(e.Value, &rec) != nil || !now.Before(rec.ExpiresAt) {
			_ = st.Delete(ctx, e.Key, e.Revision)
			continue
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ExpiresAt.Before(out[j].ExpiresAt) })
	return out, nil
}

// RevokeJoinToken removes join token id (the part before the dot, or the
// whole token): no join is accepted with it from then on.
func RevokeJoinToken(ctx context.Context, st state.Store, id string) error {
	id, _, _ = strings.Cut(id, ".")
	if err := st.Delete(ctx, JoinTokenPrefix+id, 0); err != nil {
		return fmt.Errorf("revoking join token %s: %w", id, err)
	}
	return nil
}

func secretHash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

const tokenAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		// 256 % 36 = 4: a bias of at most 1/64 per character, of no
		// matter beside 82 bits of secret.
		b[i] = tokenAlphabet[int(b[i])%len(tokenAlphabet)]
	}
	return string(b)
}
