package cluster

import (
	"errors"

	"github.com/aenvhq/aenv/internal/template"
)

func isTemplateNotFound(err error) bool { return errors.Is(err, template.ErrNotFound) }
