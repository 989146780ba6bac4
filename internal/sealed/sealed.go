// Package sealed encrypts the cluster's secrets at rest with its data key:
// the tokens in etcd's records and the environment variables and tokens in
// snapshot metadata. A sealed value is AES-256-GCM over the secret, bound
// to where it is kept (associated data), and names the key that sealed it,
// so that a keyring that still holds an older key opens what was sealed
// before a rotation.
//
// It imports nothing else of this module; the cluster, snapshot, server
// and cli packages use it.
package sealed

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// keyPrefix starts a key's text form; valuePrefix starts a sealed value.
const (
	keyPrefix   = "aenvdk1_"
	valuePrefix = "aenvsealed1:"
)

// ErrUnknownKey is a value sealed with a key the keyring lacks.
var ErrUnknownKey = errors.New("sealed with a data key this process lacks")

// ErrCorrupt is a value that does not open with the key it names: changed,
// moved to another place, or not a sealed value at all.
var ErrCorrupt = errors.New("sealed value does not open")

// Key is one data key: 32 random bytes. Its ID, derived from them, is
// what sealed values name.
type Key struct {
	ID     string
	secret []byte
}

// NewKey makes a random key.
func NewKey() Key {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand aborts the program instead)
	return keyOf(b)
}

func keyOf(secret []byte) Key {
	sum := sha256.Sum256(secret)
	return Key{ID: hex.EncodeToString(sum[:4]), secret: secret}
}

// String is the key's text form, what key files hold.
func (k Key) String() string {
	return keyPrefix + base64.RawURLEncoding.EncodeToString(k.secret)
}

// ParseKeys reads keys in text form, one per line or separated by commas
// (blank lines and lines starting with # are skipped). The first seals;
// all of them open.
func ParseKeys(text string) ([]Key, error) {
	var keys []Key
	for _, line := range strings.FieldsFunc(text, func(r rune) bool { return r == '\n' || r == ',' }) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		raw, ok := strings.CutPrefix(line, keyPrefix)
		b, err := base64.RawURLEncoding.DecodeString(raw)
		if !ok || err != nil || len(b) != 32 {
			return nil, fmt.Errorf("parsing data keys: %q... is not a data key (%s followed by 32 bytes in unpadded base64url)", truncate(line), keyPrefix)
		}
		keys = append(keys, keyOf(b))
	}
	if len(keys) == 0 {
		return nil, errors.New("parsing data keys: none found")
	}
	return keys, nil
}

func truncate(s string) string {
	if len(s) > 10 {
		return s[:10]
	}
	return s
}

// FormatKeys is ParseKeys' input for keys, one per line.
func FormatKeys(keys []Key) string {
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Keyring seals with its first key and opens with any of its keys. A nil
// Keyring seals nothing: values pass through as they are (unit tests of
// packages that store secrets). It is safe for concurrent use.
type Keyring struct {
	mu      sync.RWMutex
	current string
	aeads   map[string]cipher.AEAD
	keys    []Key
	ids     []string

	// reload, when set, is asked for the keys again when a value names an
	// unknown one (a rotation on another process), at most once a second.
	reload     func() ([]Key, error)
	reloadedAt time.Time
}

// NewKeyring makes a keyring of keys (at least one); keys[0] seals.
// reload, if not nil, gives the keys anew (see Keyring).
func NewKeyring(keys []Key, reload func() ([]Key, error)) (*Keyring, error) {
	kr := &Keyring{reload: reload}
	if err := kr.set(keys); err != nil {
		return nil, err
	}
	return kr, nil
}

func (kr *Keyring) set(keys []Key) error {
	if len(keys) == 0 {
		return errors.New("making a keyring: no keys")
	}
	aeads := make(map[string]cipher.AEAD, len(keys))
	var ids []string
	var kept []Key
	for _, k := range keys {
		block, err := aes.NewCipher(k.secret)
		if err != nil {
			return fmt.Errorf("making a keyring: key %s: %w", k.ID, err)
		}
		g, err := cipher.NewGCM(block)
		if err != nil {
			return fmt.Errorf("making a keyring: key %s: %w", k.ID, err)
		}
		if _, dup := aeads[k.ID]; !dup {
			ids, kept = append(ids, k.ID), append(kept, k)
		}
		aeads[k.ID] = g
	}
	kr.mu.Lock()
	kr.current, kr.aeads, kr.ids, kr.keys = keys[0].ID, aeads, ids, kept
	kr.mu.Unlock()
	return nil
}

// Current is the id of the key that seals.
func (kr *Keyring) Current() string {
	if kr == nil {
		return ""
	}
	kr.mu.RLock()
	defer kr.mu.RUnlock()
	return kr.current
}

// IDs are the ids of every key held, the sealing one first.
func (kr *Keyring) IDs() []string {
	if kr == nil {
		return nil
	}
	kr.mu.RLock()
	defer kr.mu.RUnlock()
	return append([]string(nil), kr.ids...)
}

// Text is the keys held in ParseKeys' form, the sealing one first: what
// a key file holds, for handing the keyring to another process.
func (kr *Keyring) Text() string {
	if kr == nil {
		return ""
	}
	kr.mu.RLock()
	defer kr.mu.RUnlock()
	return FormatKeys(kr.keys)
}

// Seal encrypts plaintext for the place named by aad (a value sealed for
// one place does not open for another). An empty plaintext stays empty:
// an absent secret needs no ciphertext.
func (kr *Keyring) Seal(plaintext, aad string) string {
	if kr == nil || plaintext == "" {
		return plaintext
	}
	kr.mu.RLock()
	id, g := kr.current, kr.aeads[kr.current]
	kr.mu.RUnlock()
	nonce := make([]byte, g.NonceSize(), g.NonceSize()+len(plaintext)+g.Overhead())
	rand.Read(nonce)
	sealed := g.Seal(nonce, nonce, []byte(plaintext), []byte(aad))
	return valuePrefix + id + ":" + base64.RawURLEncoding.EncodeToString(sealed)
}

// IsSealed reports whether value is a sealed value (of any key).
func IsSealed(value string) bool { return strings.HasPrefix(value, valuePrefix) }

// KeyOf is the id of the key that sealed value, "" if it is not sealed.
func KeyOf(value string) string {
	rest, ok := strings.CutPrefix(value, valuePrefix)
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, ":")
	return id
}

// Open decrypts a value Seal made for aad. A value that is not sealed
// (written before encryption at rest) is returned as it is.
func (kr *Keyring) Open(value, aad string) (string, error) {
	rest, ok := strings.CutPrefix(value, valuePrefix)
	if !ok {
		return value, nil
	}
	id, data, ok := strings.Cut(rest, ":")
	raw, err := base64.RawURLEncoding.DecodeString(data)
	if !ok || err != nil {
		return "", ErrCorrupt
	}
	if kr == nil {
		return "", fmt.Errorf("%w (key %s): this process has no data key", ErrUnknownKey, id)
	}
	g := kr.aead(id)
	if g == nil {
		return "", fmt.Errorf("%w (key %s; this process holds %s)", ErrUnknownKey, id, strings.Join(kr.IDs(), ", "))
	}
	if len(raw) < g.NonceSize() {
		return "", ErrCorrupt
	}
	plain, err := g.Open(nil, raw[:g.NonceSize()], raw[g.NonceSize():], []byte(aad))
	if err != nil {
		return "", fmt.Errorf("%w (key %s)", ErrCorrupt, id)
	}
	return string(plain), nil
}

// aead is key id's cipher, reloading the keys once if it is unknown.
func (kr *Keyring) aead(id string) cipher.AEAD {
	kr.mu.RLock()
	g := kr.aeads[id]
	kr.mu.RUnlock()
	if g != nil || kr.reload == nil {
		return g
	}
	kr.mu.Lock()
	if time.Since(kr.reloadedAt) < time.Second {
		kr.mu.Unlock()
		return nil
	}
	kr.reloadedAt = time.Now()
	kr.mu.Unlock()
	keys, err := kr.reload()
	if err != nil || kr.set(keys) != nil {
		return nil
	}
	kr.mu.RLock()
	defer kr.mu.RUnlock()
	return kr.aeads[id]
}
