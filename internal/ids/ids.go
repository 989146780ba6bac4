// Package ids makes the random ids of sandboxes, snapshots and volumes, so
// that the cluster (which picks an id before the node creates the sandbox)
// and the node make them alike.
package ids

import "crypto/rand"

// alphabet is what E2B sandbox ids are made of (^[a-z0-9]+$).
const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// New returns a random id of 20 characters.
func New() string {
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// MaxLen is the longest id accepted from a client: ids made here are 20
// characters, and the API has always taken up to 64.
const MaxLen = 64

// Valid reports whether s has the form of an id (^[a-z0-9]{1,64}$). It
// looks at no more than MaxLen bytes, so that a client's 64 KiB "id"
// costs no more than a real one.
func Valid(s string) bool {
	if len(s) == 0 || len(s) > MaxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
