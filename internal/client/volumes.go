package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
)

// Volume is a volume's description; Token authorises its data plane.
type Volume struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token,omitempty"`
	// SizeMB bounds its files; 0: unbounded (a volume from before sizes).
	SizeMB int64 `json:"sizeMB,omitempty"`
}

// VolumeOptions configures CreateVolume.
type VolumeOptions struct {
	// SizeMB is the volume's size in MiB; 0: the node's --volume-size.
	SizeMB int64 `json:"sizeMB,omitempty"`
}

// CreateVolume makes a volume.
func (c *Client) CreateVolume(ctx context.Context, name string, opts VolumeOptions) (*Volume, error) {
	var v Volume
	body := struct {
		Name string `json:"name"`
		VolumeOptions
	}{name, opts}
	if err := c.do(ctx, http.MethodPost, "/volumes", body, &v); err != nil {
		return nil, fmt.Errorf("creating volume %s: %w", name, err)
	}
	return &v, nil
}

// ListVolumes returns the caller's volumes.
func (c *Client) ListVolumes(ctx context.Context) ([]Volume, error) {
	var out []Volume
	if err := c.do(ctx, http.MethodGet, "/volumes", nil, &out); err != nil {
		return nil, fmt.Errorf("listing volumes: %w", err)
	}
	return out, nil
}

// DeleteVolume removes a volume (by id) and its files.
func (c *Client) DeleteVolume(ctx context.Context, id string) error {
	if err := c.do(ctx, http.MethodDelete, "/volumes/"+url.PathEscape(id), nil, nil); err != nil {
		return fmt.Errorf("deleting volume %s: %w", id, err)
	}
	return nil
}
