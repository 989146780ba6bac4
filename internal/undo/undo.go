// Package undo is an ordered stack of compensating steps: a multi-step
// operation pushes the undo of each step it completes, and on failure runs
// them newest first, so that a failed create leaves nothing behind. Any
// package may import it.
package undo

import (
	"context"
	"log/slog"
)

// Stack holds undo steps. The zero value is ready to use. It is not safe
// for concurrent use.
type Stack struct {
	steps []step
}

type step struct {
	what string
	fn   func(context.Context) error
}

// Push records fn as the undo of a step described by what.
func (s *Stack) Push(what string, fn func(context.Context) error) {
	s.steps = append(s.steps, step{what, fn})
}

// Run runs every recorded step, newest first, logging (not returning) the
// failures: an undo that fails must not stop the others.
func (s *Stack) Run(ctx context.Context, log *slog.Logger) {
	for i := len(s.steps) - 1; i >= 0; i-- {
		if err := s.steps[i].fn(ctx); err != nil {
			log.Warn("undo step failed", "step", s.steps[i].what, "err", err)
		}
	}
	s.steps = nil
}
