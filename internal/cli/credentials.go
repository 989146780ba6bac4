package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// credentials is what 'aenv auth' stores: one server, its key, and the
// CA its certificate is signed by when that is not a system root.
type credentials struct {
	URL string `json:"url"`
	Key string `json:"key"`
	// CA is PEM.
	CA string `json:"ca,omitempty"`
}

// credentialsPath is $XDG_CONFIG_HOME/aenv/credentials, by default
// ~/.config/aenv/credentials.
func credentialsPath() (string, error) {
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding the credentials file: %w", err)
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "aenv", "credentials"), nil
}

// loadCredentials reads the credentials file; it returns nil when there
// is none.
func loadCredentials() (*credentials, error) {
	path, err := credentialsPath()
	if err != nil {
		return nil, nil // no home: nothing stored
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading credentials %s: %w", path, err)
	}
	var c credentials
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("reading credentials %s: %v (run 'aenv auth' to write it again)", path, err)
	}
	return &c, nil
}

// saveCredentials writes c where loadCredentials finds it: the file mode
// 0600 in a directory mode 0700, replaced atomically so that a crash never
// leaves half a key.
func saveCredentials(c credentials) (string, error) {
	path, err := credentialsPath()
	if err != nil {
		return "", err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("saving credentials: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("saving credentials: %w", err)
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, ".credentials-*")
	if err != nil {
		return "", fmt.Errorf("saving credentials: %w", err)
	}
	defer os.Remove(f.Name()) // fails harmlessly once renamed
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return "", fmt.Errorf("saving credentials: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return "", fmt.Errorf("saving credentials: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", fmt.Errorf("saving credentials: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("saving credentials: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return "", fmt.Errorf("saving credentials: %w", err)
	}
	return path, nil
}

// sameURL compares server URLs the way a user would: without a trailing
// slash and ignoring the case of scheme and host.
func sameURL(a, b string) bool {
	return strings.EqualFold(strings.TrimRight(a, "/"), strings.TrimRight(b, "/"))
}
