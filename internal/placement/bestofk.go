package placement

import (
	"math/rand/v2"
	"slices"
	"sync"
)

// BestOfK is the power of K choices: among the nodes Filter keeps (the
// preferred one first, if it is there, then the Warm ones), K distinct
// ones drawn at random, the one with the most Headroom wins. Two choices
// spread load nearly as well as scanning every node, at a cost that does
// not grow
// with the cluster, and servers placing at once rarely pick the same
// node; more choices crowd onto the emptiest nodes.
type BestOfK struct {
	k int

	mu  sync.Mutex
	rnd *rand.Rand // nil: math/rand/v2's global source
}

var _ Algorithm = (*BestOfK)(nil)

// DefaultK is the K of the scheduler: two random candidates.
const DefaultK = 2

// NewBestOfK returns the algorithm drawing k candidates (at least 1) from
// rnd, or from the global source when rnd is nil. A seeded rnd makes its
// choices repeat, for tests.
func NewBestOfK(k int, rnd *rand.Rand) *BestOfK {
	return &BestOfK{k: max(k, 1), rnd: rnd}
}

// Place implements Algorithm.
func (b *BestOfK) Place(req Request, nodes []*Node) (*Node, error) {
	fits, err := Filter(req, nodes)
	if err != nil {
		return nil, err
	}
	if n := preferred(req, fits); n != nil {
		return n, nil
	}
	return b.pick(req, Warm(req, fits)), nil
}

// pick draws k distinct nodes of fits (all of them when there are no
// more; fits is not empty) and returns the one with the most Headroom,
// the first drawn on a tie. Drawn with replacement, two nodes would be
// compared with themselves a quarter of the time: the fuller of a
// two-node cluster took one placement in four whatever its load.
func (b *BestOfK) pick(req Request, fits []*Node) *Node {
	k := min(b.k, len(fits))
	drawn := make([]int, 0, k)
	best, score := (*Node)(nil), 0
	for len(drawn) < k {
		i := b.intN(len(fits))
		if slices.Contains(drawn, i) {
			continue
		}
		drawn = append(drawn, i)
		if s := Headroom(req, fits[i]); best == nil || s > score {
			best, score = fits[i], s
		}
	}
	return best
}

func (b *BestOfK) intN(n int) int {
	if b.rnd == nil {
		return rand.IntN(n)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rnd.IntN(n)
}
