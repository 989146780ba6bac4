package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/template"
)

// Every key belongs to a team, and everything it makes belongs to that
// team: a non-admin key sees only its team's sandboxes, snapshots,
// templates, volumes and builds, and another team's answer exactly as
// ones that do not exist. Admin keys (the operator's) act across teams.

// owner is who a request acts for.
func owner(r *http.Request) cluster.Owner {
	k := callerKey(r)
	return cluster.Owner{KeyID: k.ID, Team: k.Team, Admin: k.Admin, MaxSandboxes: k.MaxSandboxes}
}

// writeSandboxNotFound answers as for a sandbox id nobody knows.
func (s *Handler) writeSandboxNotFound(w http.ResponseWriter, r *http.Request, id string) {
	s.writeClusterError(w, r, cluster.NotFoundError(id))
}

// ownSandbox checks that the caller's team owns sandbox id (or the caller
// is an admin) before the handler runs. A sandbox gone in the last day is
// its team's still: its logs and metrics outlive it, and the reason it
// died is shown to that team only.
func (s *Handler) ownSandbox(w http.ResponseWriter, r *http.Request, id string) bool {
	o := owner(r)
	sb, err := s.cfg.Cluster.Get(r.Context(), id)
	var gone *cluster.GoneError
	switch {
	case err == nil:
		if o.Sees(sb.TeamID()) {
			return true
		}
	case errors.As(err, &gone):
		if o.Sees(gone.Team) {
			return true
		}
	case !errors.Is(err, cluster.ErrNotFound):
		s.writeClusterError(w, r, err)
		return false
	}
	s.writeSandboxNotFound(w, r, id)
	return false
}

// teamTag qualifies a team's template names: a short hash of the team, so
// that template ids stay within their 63 characters whatever the team's
// id. 40 bits: two teams' tags collide with odds far below those of any
// other failure.
func teamTag(team string) string {
	sum := sha256.Sum256([]byte(team))
	return hex.EncodeToString(sum[:5])
}

// maxTemplateName leaves room for the team's tag in a template id.
const maxTemplateName = 63 - 1 - 10

// teamTemplateID is the id of team's template called name.
func teamTemplateID(team, name string) string { return name + "." + teamTag(team) }

// validTemplateName checks a name a team gives a template.
func validTemplateName(name string) error {
	if !template.ValidID(name) || len(name) > maxTemplateName {
		return fmt.Errorf("invalid template name %q: lower-case letters, digits, '.', '_' and '-', at most %d, starting with a letter or digit", truncate(name), maxTemplateName)
	}
	if name == template.BaseID {
		return fmt.Errorf("template name %q is reserved for the built-in base template", name)
	}
	return nil
}

// newTemplate describes the caller's team's template called name.
func newTemplate(r *http.Request, name string) template.Template {
	team := callerKey(r).Team
	return template.Template{ID: teamTemplateID(team, name), Team: team, Name: name}
}

// templateAccess is what a caller may do with a template.
type templateAccess int

const (
	templateHidden   templateAccess = iota // another team's: as if it did not exist
	templateReadOnly                       // public, built in, or from before teams
	templateOwned                          // the caller's team's, or any for an admin
)

// accessTo says what o may do with t.
func accessTo(o cluster.Owner, t *template.Template, public map[string]bool) templateAccess {
	switch {
	case o.Admin || (t.Team != "" && t.Team == o.Team):
		return templateOwned
	case t.Team == "" || public[t.ID]:
		return templateReadOnly
	default:
		return templateHidden
	}
}

// visibleTemplates lists the templates o sees.
func (s *Handler) visibleTemplates(ctx context.Context, o cluster.Owner) ([]*template.Template, map[string]bool, error) {
	all, err := s.cfg.Templates.List()
	if err != nil {
		return nil, nil, err
	}
	public, err := s.cfg.Cluster.PublicTemplates(ctx)
	if err != nil {
		return nil, nil, err
	}
	out := all[:0]
	for _, t := range all {
		if accessTo(o, t, public) != templateHidden {
			out = append(out, t)
		}
	}
	return out, public, nil
}

// findTemplate resolves ref as o names templates: its team's name first,
// then an id or alias it may see, then a public template's name.
func (s *Handler) findTemplate(ctx context.Context, o cluster.Owner, ref string) (*template.Template, templateAccess, error) {
	if !template.ValidID(ref) {
		return nil, templateHidden, fmt.Errorf("%w: %q", template.ErrNotFound, truncate(ref))
	}
	var public map[string]bool
	publicMarks := func() (map[string]bool, error) {
		if public == nil {
			var err error
			if public, err = s.cfg.Cluster.PublicTemplates(ctx); err != nil {
				return nil, err
			}
		}
		return public, nil
	}
	// This host's templates first (directory reads), then the store the
	// nodes share (a round trip each): the builtins, base and the local
	// templates a create names most never cost one.
	for _, get := range []func(string) (*template.Template, error){s.cfg.Templates.GetLocal, s.cfg.Templates.Get} {
		if o.Team != "" && len(ref) <= maxTemplateName {
			if t, err := get(teamTemplateID(o.Team, ref)); err == nil {
				return t, templateOwned, nil
			} else if !errors.Is(err, template.ErrNotFound) {
				return nil, templateHidden, err
			}
		}
		t, err := get(ref)
		if err != nil && !errors.Is(err, template.ErrNotFound) {
			return nil, templateHidden, err
		}
		if err == nil {
			p, perr := publicMarks()
			if perr != nil {
				return nil, templateHidden, perr
			}
			if a := accessTo(o, t, p); a != templateHidden {
				return t, a, nil
			}
		}
	}
	// A public template by the name its team gave it.
	p, err := publicMarks()
	if err != nil {
		return nil, templateHidden, err
	}
	if len(p) > 0 {
		all, err := s.cfg.Templates.List()
		if err != nil {
			return nil, templateHidden, err
		}
		slices.SortFunc(all, func(a, b *template.Template) int { return a.CreatedAt.Compare(b.CreatedAt) })
		for _, t := range all {
			if p[t.ID] && t.Name == ref {
				return t, accessTo(o, t, p), nil
			}
		}
	}
	return nil, templateHidden, fmt.Errorf("looking up template %q: %w", ref, template.ErrNotFound)
}

// resolveCreate turns a create's templateID into what the node starts
// from: a template o sees (templateID), or one of its team's user
// snapshots (snapshotID; never a pause or fork snapshot, which hold some
// sandbox's state). The two are kept apart so the node need not guess.
func (s *Handler) resolveCreate(ctx context.Context, o cluster.Owner, ref string) (templateID, snapshotID string, err error) {
	if ref == template.BaseID {
		return ref, "", nil // every node's own, the warm pool's
	}
	if t, _, err := s.findTemplate(ctx, o, ref); err == nil {
		return t.ID, "", nil
	} else if !errors.Is(err, template.ErrNotFound) {
		return "", "", err
	}
	snap, err := s.cfg.Cluster.GetSnapshot(ctx, o, ref)
	if err == nil {
		return "", snap.ID, nil
	}
	if errors.Is(err, cluster.ErrNotFound) {
		return "", "", fmt.Errorf("%w: %q", cluster.ErrTemplateNotFound, ref)
	}
	return "", "", err
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
