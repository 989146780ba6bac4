package netns

import (
	"context"
	"testing"
	"time"
)

// BenchmarkAcquireRelease: Acquire from a full pool, then Release. The pool
// is refilled (untimed) between iterations, so every Acquire is a hit;
// acquire-ns/op is the Acquire alone.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts SlotOptions
	}{
		{"closed", SlotOptions{}},
		{"internet", SlotOptions{AllowInternet: true}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m, _ := newTestManager(b, 4)
			ctx := context.Background()
			var acquiring time.Duration
			for b.Loop() {
				b.StopTimer()
				waitPool(b, m, 4)
				b.StartTimer()
				start := time.Now()
				s, err := m.Acquire(ctx, bc.opts)
				acquiring += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				if err := m.Release(ctx, s); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(acquiring.Nanoseconds())/float64(b.N), "acquire-ns/op")
		})
	}
}

// BenchmarkBuildSlot: a slot built from nothing (what a pool miss costs),
// destroyed untimed.
func BenchmarkBuildSlot(b *testing.B) {
	m, _ := newTestManager(b, -1)
	ctx := context.Background()
	for b.Loop() {
		s, err := m.Acquire(ctx, SlotOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := m.Release(ctx, s); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkRecycle: putting a used slot back into the pool instead of
// destroying it and building another.
func BenchmarkRecycle(b *testing.B) {
	m, _ := newUnfilledManager(b, 1)
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		s, err := m.Acquire(ctx, SlotOptions{})
		if err != nil {
			b.Fatal(err)
		}
		simulateRunsc(b, s)
		b.StartTimer()
		if err := m.Recycle(ctx, s); err != nil {
			b.Fatal(err)
		}
		if m.poolLen() != 1 {
			b.Fatal("the slot was not recycled")
		}
	}
}

// BenchmarkRelease: Release alone; the host interface's deletion goes on
// in the background.
func BenchmarkRelease(b *testing.B) {
	m, _ := newTestManager(b, -1)
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		s, err := m.Acquire(ctx, SlotOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := m.Release(ctx, s); err != nil {
			b.Fatal(err)
		}
	}
}
