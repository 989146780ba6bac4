//go:build race

package cluster

// raceEnabled: the race detector slows everything several times over, so
// timings mean nothing and the scale test shrinks.
const raceEnabled = true
