package build

import (
	"io"

	"github.com/aenvhq/aenv/internal/buildspec"
)

// What a build is, as written, lives in package buildspec (which the API
// uses without linking the runtime); these names keep build's callers
// whole.
type (
	// Dockerfile is buildspec.Dockerfile.
	Dockerfile = buildspec.Dockerfile
	// Step is buildspec.Step.
	Step = buildspec.Step
	// FromKind is buildspec.FromKind.
	FromKind = buildspec.FromKind
)

// Step kinds and FROM kinds, as buildspec names them.
const (
	StepRun     = buildspec.StepRun
	StepEnv     = buildspec.StepEnv
	StepArg     = buildspec.StepArg
	StepWorkdir = buildspec.StepWorkdir
	StepUser    = buildspec.StepUser
	StepCopy    = buildspec.StepCopy
	StepCmd     = buildspec.StepCmd
	StepEntry   = buildspec.StepEntry

	FromAuto     = buildspec.FromAuto
	FromTemplate = buildspec.FromTemplate
	FromImage    = buildspec.FromImage
)

// Parse is buildspec.Parse.
func Parse(r io.Reader) (*Dockerfile, error) { return buildspec.Parse(r) }

// UnpackContext is buildspec.UnpackContext.
func UnpackContext(r io.Reader, dest string) error { return buildspec.UnpackContext(r, dest) }
