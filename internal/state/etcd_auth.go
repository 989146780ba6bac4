package state

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Permission is access to one key, or to every key under a prefix, of
// the store (keys as callers name them: Prefix is added).
type Permission struct {
	Key string
	// Prefix: every key that starts with Key, not Key alone.
	Prefix bool
	// Write: read and write (etcd's readwrite); else read only. A lease
	// is renewed and revoked only by a user who may write every key
	// bound to it.
	Write bool
}

// rootRole is etcd's built-in role that may do anything, auth included.
const rootRole = "root"

// EnableAuth turns etcd's auth on, if it is not yet, with admins as
// users of the root role: etcd wants a user "root" of that role before
// it enables auth (it is made without a password, so only a certificate
// naming "root" could log in as it), and the callers that manage users
// (servers) need the root role too, as nothing less may. The users have
// no password: with client-certificate auth, etcd takes the user name
// from the certificate's CommonName. Calling it again, from any admin,
// is harmless.
func (e *Etcd) EnableAuth(ctx context.Context, admins ...string) error {
	op := "enabling etcd auth"
	if e.closed.Load() {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, 4*e.cfg.OpTimeout)
	defer cancel()
	st, err := e.client.AuthStatus(ctx)
	if err != nil {
		return e.wrap(op, err)
	}
	if st.Enabled {
		return nil
	}
	for _, u := range append([]string{"root"}, admins...) {
		if err := e.addUser(ctx, u); err != nil {
			return e.wrap(op, err)
		}
		if _, err := e.client.UserGrantRole(ctx, u, rootRole); err != nil {
			return e.wrap(fmt.Sprintf("%s: granting %s the root role", op, u), err)
		}
	}
	if _, err := e.client.AuthEnable(ctx); err != nil {
		return e.wrap(op, err)
	}
	return nil
}

// AuthEnabled reports whether etcd's auth is on.
func (e *Etcd) AuthEnabled(ctx context.Context) (bool, error) {
	if e.closed.Load() {
		return false, fmt.Errorf("reading etcd's auth status: %w", ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.OpTimeout)
	defer cancel()
	st, err := e.client.AuthStatus(ctx)
	if err != nil {
		return false, e.wrap("reading etcd's auth status", err)
	}
	return st.Enabled, nil
}

// SetUser makes user exist, without a password, with one role of the
// same name that holds exactly perms (what it held beyond them is
// revoked). It needs the root role.
func (e *Etcd) SetUser(ctx context.Context, user string, perms []Permission) error {
	op := "setting etcd user " + user
	if e.closed.Load() {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, 4*e.cfg.OpTimeout)
	defer cancel()
	if err := e.addUser(ctx, user); err != nil {
		return e.wrap(op, err)
	}
	if _, err := e.client.RoleAdd(ctx, user); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return e.wrap(op, err)
	}
	role, err := e.client.RoleGet(ctx, user)
	if err != nil {
		return e.wrap(op, err)
	}
	want := e.etcdPerms(perms)
	held := make([]etcdPerm, 0, len(role.Perm))
	for _, p := range role.Perm {
		held = append(held, etcdPerm{key: string(p.Key), end: string(p.RangeEnd), typ: clientv3.PermissionType(p.PermType)})
	}
	for _, h := range held {
		if !slices.Contains(want, h) {
			if _, err := e.client.RoleRevokePermission(ctx, user, h.key, h.end); err != nil {
				return e.wrap(op, err)
			}
		}
	}
	for _, w := range want {
		if slices.Contains(held, w) {
			continue
		}
		if _, err := e.client.RoleGrantPermission(ctx, user, w.key, w.end, w.typ); err != nil {
			return e.wrap(op, err)
		}
	}
	if _, err := e.client.UserGrantRole(ctx, user, user); err != nil {
		return e.wrap(op, err)
	}
	return nil
}

// RemoveUser deletes user and its role (SetUser's); either missing is
// no error.
func (e *Etcd) RemoveUser(ctx context.Context, user string) error {
	op := "removing etcd user " + user
	if e.closed.Load() {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*e.cfg.OpTimeout)
	defer cancel()
	if _, err := e.client.UserDelete(ctx, user); err != nil && !errors.Is(err, rpctypes.ErrUserNotFound) {
		return e.wrap(op, err)
	}
	if _, err := e.client.RoleDelete(ctx, user); err != nil && !errors.Is(err, rpctypes.ErrRoleNotFound) {
		return e.wrap(op, err)
	}
	return nil
}

func (e *Etcd) addUser(ctx context.Context, user string) error {
	_, err := e.client.UserAddWithOptions(ctx, user, "", &clientv3.UserAddOptions{NoPassword: true})
	if err != nil && !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
		return fmt.Errorf("adding user %s: %w", user, err)
	}
	return nil
}

// etcdPerm is a permission as etcd holds it.
type etcdPerm struct {
	key, end string
	typ      clientv3.PermissionType
}

// etcdPerms are perms as etcd holds them: under the store's prefix, a
// prefix as the range up to its end, one key with no range end.
func (e *Etcd) etcdPerms(perms []Permission) []etcdPerm {
	out := make([]etcdPerm, 0, len(perms))
	for _, p := range perms {
		ep := etcdPerm{key: e.prefix + p.Key, typ: clientv3.PermissionType(clientv3.PermRead)}
		if p.Prefix {
			ep.end = clientv3.GetPrefixRangeEnd(ep.key)
		}
		if p.Write {
			ep.typ = clientv3.PermissionType(clientv3.PermReadWrite)
		}
		out = append(out, ep)
	}
	return out
}
