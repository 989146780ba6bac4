//go:build !linux

package netns

import (
	"context"
	"net/netip"
)

// nftConn stands in for the nftables connection a Linux slot keeps.
type nftConn = *struct{}

// Manager owns the network slots of one host. Only Linux has them; elsewhere
// every method fails with ErrUnsupported.
type Manager struct{}

// NewManager fails with ErrUnsupported outside Linux.
func NewManager(ctx context.Context, cfg Config) (*Manager, error) { return nil, ErrUnsupported }

// Acquire fails with ErrUnsupported outside Linux.
func (m *Manager) Acquire(ctx context.Context, opts SlotOptions) (*Slot, error) {
	return nil, ErrUnsupported
}

// UpdateEgress fails with ErrUnsupported outside Linux.
func (m *Manager) UpdateEgress(ctx context.Context, s *Slot, opts SlotOptions) error {
	return ErrUnsupported
}

// Release fails with ErrUnsupported outside Linux.
func (m *Manager) Release(ctx context.Context, s *Slot) error { return ErrUnsupported }

// Recycle fails with ErrUnsupported outside Linux.
func (m *Manager) Recycle(ctx context.Context, s *Slot) error { return ErrUnsupported }

// Adopt fails with ErrUnsupported outside Linux.
func (m *Manager) Adopt(name string) (*Slot, error) { return nil, ErrUnsupported }

// ReleaseLeftovers does nothing outside Linux.
func (m *Manager) ReleaseLeftovers(ctx context.Context) error { return nil }

// Detach does nothing outside Linux.
func (m *Manager) Detach(ctx context.Context) error { return nil }

// SetHostNetworks fails with ErrUnsupported outside Linux.
func (m *Manager) SetHostNetworks(ps []netip.Prefix) error { return ErrUnsupported }

// SetClusterAddrs fails with ErrUnsupported outside Linux.
func (m *Manager) SetClusterAddrs(addrs []netip.Addr) error { return ErrUnsupported }

// DetectHostNetworks fails with ErrUnsupported outside Linux.
func DetectHostNetworks(tag string) ([]netip.Prefix, error) { return nil, ErrUnsupported }

// WatchHostNetworks fails with ErrUnsupported outside Linux.
func WatchHostNetworks(ctx context.Context, tag string, fn func([]netip.Prefix)) error {
	return ErrUnsupported
}

// Close does nothing outside Linux.
func (m *Manager) Close(ctx context.Context) error { return nil }

// Reap fails with ErrUnsupported outside Linux.
func Reap(ctx context.Context, cfg Config) error { return ErrUnsupported }

// slotProxy exists on Linux only.
type slotProxy struct{}
