package netns

import (
	"context"
	"errors"
	"fmt"
)

// Adopt takes back a slot that an earlier manager of this RunDir handed
// out (see Config.KeepLeftovers), by the name it had: the restarted node
// whose sandbox still runs in it then owns it as if Acquire had returned
// it. Its egress rules are the ones in force; UpdateEgress replaces them.
func (m *Manager) Adopt(name string) (*Slot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("adopting slot %s: %w", name, ErrClosed)
	}
	s, ok := m.leftovers[name]
	if !ok {
		return nil, fmt.Errorf("adopting slot %s: %w", name, ErrNotHeld)
	}
	delete(m.leftovers, name)
	m.held[s] = struct{}{}
	return s, nil
}

// ReleaseLeftovers destroys the slots of an earlier manager that nobody
// adopted: their sandboxes are gone or unwanted.
func (m *Manager) ReleaseLeftovers(ctx context.Context) error {
	m.mu.Lock()
	slots := make([]*Slot, 0, len(m.leftovers))
	for _, s := range m.leftovers {
		slots = append(slots, s)
	}
	m.leftovers = map[string]*Slot{}
	m.ops.Add(1)
	m.mu.Unlock()
	defer m.ops.Done()
	var errs []error
	for _, s := range slots {
		m.log.Debug("releasing a network slot of an earlier run that no sandbox uses", "slot", s.Name)
		if err := m.destroy(s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Detach stops the manager but leaves the slots it handed out (and the
// host rules that isolate them) in place, for a manager started with
// KeepLeftovers to adopt: the sandboxes in them keep running across a
// restart of the process. Pooled slots are destroyed. After Detach the
// Manager is closed.
func (m *Manager) Detach(ctx context.Context) error {
	if !m.shutDown() {
		return nil
	}

	m.mu.Lock()
	pooled := m.pool
	m.pool = nil
	m.mu.Unlock()
	var errs []error
	for _, s := range pooled {
		if err := m.destroy(s); err != nil {
			errs = append(errs, err)
		}
	}
	m.ops.Wait()
	m.mu.Lock()
	for s := range m.held {
		s.dropNFT()
	}
	m.mu.Unlock()
	// The run directory's self-bind stays: the held slots' namespace
	// files are mounted inside it, and its marker tells the next manager
	// it is ours.
	if err := m.lock.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detaching netns manager: %w", err)
	}
	return nil
}
