package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Template is the server's description of a template.
type Template struct {
	TemplateID string    `json:"templateID"`
	BuildID    string    `json:"buildID"`
	Aliases    []string  `json:"aliases"`
	CPUCount   int       `json:"cpuCount"`
	MemoryMB   int       `json:"memoryMB"`
	DiskSizeMB int       `json:"diskSizeMB"`
	Public     bool      `json:"public"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	// SizeBytes is the disk space the template's files take.
	SizeBytes int64 `json:"sizeBytes"`
	// ImageBytes is its block image's size; UniqueBytes the part of it no
	// other template's image shares in the store.
	ImageBytes  int64 `json:"imageBytes,omitempty"`
	UniqueBytes int64 `json:"uniqueBytes,omitempty"`
	// Team owns it; empty for base, the builtins and templates from
	// before teams, which every team sees.
	Team string `json:"team,omitempty"`
}

// TemplateUsage is what the templates' block images take.
type TemplateUsage struct {
	// ImageBytes is the sum of the images' sizes; StoredBytes what the
	// store keeps of them, each shared chunk once.
	ImageBytes  int64 `json:"imageBytes"`
	StoredBytes int64 `json:"storedBytes"`
}

// TemplateUsage asks what the templates' block images take in the store.
func (c *Client) TemplateUsage(ctx context.Context) (*TemplateUsage, error) {
	var u TemplateUsage
	if err := c.do(ctx, "GET", "/templates/usage", nil, &u); err != nil {
		return nil, err
	}
	return &u, nil
}

// ListTemplates returns the server's templates.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	out := []Template{}
	if err := c.do(ctx, http.MethodGet, "/templates", nil, &out); err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	return out, nil
}

// DeleteTemplate removes a template.
func (c *Client) DeleteTemplate(ctx context.Context, id string) error {
	if err := c.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(id), nil, nil); err != nil {
		return fmt.Errorf("deleting template %s: %w", id, err)
	}
	return nil
}
