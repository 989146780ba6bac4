package membership

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
)

// RandomHex is n random bytes in hex, for generated secrets.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// StoreSecret writes value to path, readable by its owner only.
func StoreSecret(path, value string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(value+"\n"), 0o600)
}
