//go:build !race

package cluster

// raceEnabled: see race_on_test.go.
const raceEnabled = false
