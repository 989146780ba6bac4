package cluster

import (
	"fmt"
	"strings"
)

func (c *Cluster) validate(req *CreateRequest) error {
	if err := req.Network.validate(); err != nil {
		return err
	}
	l := c.cfg.Limits
	switch {
	case req.Timeout <= 0:
		return fmt.Errorf("%w: timeout must be positive", ErrInvalid)
	case req.Timeout > l.MaxTimeout:
		return fmt.Errorf("%w: timeout %s exceeds the maximum of %s", ErrInvalid, req.Timeout, l.MaxTimeout)
	case req.CPUCount < 0 || req.CPUCount > l.MaxCPUCount:
		return fmt.Errorf("%w: cpuCount must be between 1 and %d", ErrInvalid, l.MaxCPUCount)
	case req.MemoryMB < 0 || req.MemoryMB > l.MaxMemoryMB:
		return fmt.Errorf("%w: memoryMB must be between 128 and %d", ErrInvalid, l.MaxMemoryMB)
	case req.MemoryMB > 0 && req.MemoryMB < 128:
		return fmt.Errorf("%w: memoryMB must be at least 128", ErrInvalid)
	case req.AutoResume && !req.AutoPause:
		return fmt.Errorf("%w: autoResume needs the sandbox to pause on timeout (autoPause)", ErrInvalid)
	case len(req.Metadata) > l.MaxMetadata:
		return fmt.Errorf("%w: at most %d metadata entries", ErrInvalid, l.MaxMetadata)
	case len(req.EnvVars) > 4*l.MaxMetadata:
		return fmt.Errorf("%w: at most %d envVars", ErrInvalid, 4*l.MaxMetadata)
	}
	envBytes := 0
	for k, v := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") || len(k) > maxEnvNameBytes {
			return fmt.Errorf("%w: invalid env var name %q (no '=' or NUL, at most %d bytes)", ErrInvalid, truncate(k), maxEnvNameBytes)
		}
		if len(v) > maxEnvValueBytes || strings.ContainsRune(v, 0) {
			return fmt.Errorf("%w: envVars[%q] is %d bytes; values are at most %d bytes, without NUL", ErrInvalid, k, len(v), maxEnvValueBytes)
		}
		envBytes += len(k) + len(v)
	}
	if envBytes > maxEnvTotalBytes {
		return fmt.Errorf("%w: envVars take %d bytes; at most %d in all", ErrInvalid, envBytes, maxEnvTotalBytes)
	}
	metaBytes := 0
	for k, v := range req.Metadata {
		if k == "" || len(k) > maxMetadataKeyBytes {
			return fmt.Errorf("%w: metadata key %q must be 1 to %d bytes", ErrInvalid, truncate(k), maxMetadataKeyBytes)
		}
		if len(v) > maxMetadataValueBytes {
			return fmt.Errorf("%w: metadata[%q] is %d bytes; values are at most %d bytes", ErrInvalid, k, len(v), maxMetadataValueBytes)
		}
		metaBytes += len(k) + len(v)
	}
	if metaBytes > maxMetadataTotalBytes {
		return fmt.Errorf("%w: metadata takes %d bytes; at most %d in all", ErrInvalid, metaBytes, maxMetadataTotalBytes)
	}
	return nil
}

// Size limits of what a create may carry. Every process of the sandbox
// gets the env vars (Linux refuses a single string over 128 KiB in an
// exec), and every list and record carries the metadata.
const (
	maxEnvNameBytes       = 256
	maxEnvValueBytes      = 32 << 10
	maxEnvTotalBytes      = 64 << 10
	maxMetadataKeyBytes   = 128
	maxMetadataValueBytes = 1 << 10
	maxMetadataTotalBytes = 16 << 10
)

// truncate shortens s for an error message.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
