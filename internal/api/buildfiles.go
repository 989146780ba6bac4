package api

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Uploaded build files (COPY sources, under filesRoot by team and hash:
// fileKey) go when the build that used them ends, unless a client asked for them since it
// started (another build on its way may use them); what no build used
// goes after BuildFilesMaxAge (SweepBuildFiles).

// BuildFilesMaxAge is how long uploaded build files that no build used
// are kept after they were last uploaded or asked for.
const BuildFilesMaxAge = 24 * time.Hour

// trashPrefix names an upload on its way out: renamed under the lock,
// removed after it.
const trashPrefix = ".trash-"

// filesRoot holds every team's uploads.
func (bs *builds) filesRoot() string {
	return filepath.Join(bs.s.cfg.Templates.Dir(), ".build-files")
}

// fileKey names team's upload of hash, under filesRoot: the keys the
// functions below take.
func fileKey(team, hash string) string { return teamTag(team) + "/" + hash }

// fileKeys are team's uploads of hashes.
func fileKeys(team string, hashes []string) []string {
	out := make([]string, len(hashes))
	for i, h := range hashes {
		out[i] = fileKey(team, h)
	}
	return out
}

// touchFiles records that a client asked for the upload key (its
// marker's time), so that a build ending now leaves it for the client.
func (bs *builds) touchFiles(key string) {
	now := time.Now()
	os.Chtimes(filepath.Join(bs.filesRoot(), key, uploadDone), now, now)
}

// acquireFiles marks the files of hashes in use by a build starting now;
// false if one is gone (a sweep took it since it was checked).
func (bs *builds) acquireFiles(hashes []string) bool {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for _, h := range hashes {
		if _, err := os.Stat(filepath.Join(bs.filesRoot(), h, uploadDone)); err != nil {
			return false
		}
	}
	for _, h := range hashes {
		bs.filesInUse[h]++
	}
	return true
}

// releaseFiles ends a build's use of the files of hashes, which started
// at started: those no other build uses and no client asked for since are
// removed.
func (bs *builds) releaseFiles(hashes []string, started time.Time) {
	var trash []string
	bs.mu.Lock()
	for _, h := range hashes {
		if bs.filesInUse[h]--; bs.filesInUse[h] > 0 {
			continue
		}
		delete(bs.filesInUse, h)
		fi, err := os.Stat(filepath.Join(bs.filesRoot(), h, uploadDone))
		if err == nil && fi.ModTime().Before(started) {
			if t := bs.trashLocked(h); t != "" {
				trash = append(trash, t)
			}
		}
	}
	bs.mu.Unlock()
	for _, t := range trash {
		if err := os.RemoveAll(t); err != nil {
			bs.s.log.Warn("removing a build's uploaded files", "err", err)
		}
	}
}

// trashLocked renames the upload key aside and returns its new path
// ("" if it could not).
func (bs *builds) trashLocked(name string) string {
	t := filepath.Join(bs.filesRoot(), trashPrefix+randomHex(8))
	if err := os.Rename(filepath.Join(bs.filesRoot(), name), t); err != nil {
		bs.s.log.Warn("removing uploaded build files", "hash", name, "err", err)
		return ""
	}
	return t
}

// SweepBuildFiles removes the uploaded build files that no running build
// uses and nobody uploaded or asked for since before now minus
// BuildFilesMaxAge (uploads whose build never came), and uploads that
// never finished; it returns how many went. The server calls it hourly.
func (s *Handler) SweepBuildFiles(now time.Time) (int, error) {
	bs := s.builds
	root := bs.filesRoot()
	teams, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sweeping build files: %w", err)
	}
	cutoff := now.Add(-BuildFilesMaxAge)
	var trash []string
	bs.mu.Lock()
	for _, team := range teams {
		if strings.HasPrefix(team.Name(), trashPrefix) {
			trash = append(trash, filepath.Join(root, team.Name())) // left by a crash
			continue
		}
		entries, err := os.ReadDir(filepath.Join(root, team.Name()))
		if err != nil {
			continue
		}
		for _, e := range entries {
			key := team.Name() + "/" + e.Name()
			if bs.filesInUse[key] > 0 {
				continue
			}
			// An upload's time is its marker's (last uploaded or asked
			// for); one that never finished has only its directory's.
			fi, err := os.Stat(filepath.Join(root, key, uploadDone))
			if err != nil {
				fi, err = e.Info()
			}
			if err != nil || !fi.ModTime().Before(cutoff) {
				continue
			}
			if t := bs.trashLocked(key); t != "" {
				trash = append(trash, t)
			}
		}
	}
	bs.mu.Unlock()
	var errs []error
	for _, t := range trash {
		errs = append(errs, os.RemoveAll(t))
	}
	if err := errors.Join(errs...); err != nil {
		return len(trash), fmt.Errorf("sweeping build files: %w", err)
	}
	return len(trash), nil
}
