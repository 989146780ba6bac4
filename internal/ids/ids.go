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
