// Package membership is what the control plane and the node agents share,
// and all they share beside the node API's wire (package nodeapi): the
// cluster's credentials (the cluster token, the data keys) and their
// checks against the live state, the join a node agent asks a server
// for, the node registry's records and the lease that keeps a node in
// it, the servers' records, where the cluster's members are (Members,
// which nodes keep their sandboxes off), and the mark of a node that is
// stopping. Package cluster reads the registry; the node agent (package
// agent) writes its own record. Neither
// imports the other, as Nomad's client and server share only structs.
package membership

// StopMode says what stopping a process (a server, a node agent) does
// with the sandboxes it runs.
type StopMode int

// Stop modes.
const (
	// StopKeep leaves them running and recorded, for the next process;
	// its node stays registered until its lease expires.
	StopKeep StopMode = iota
	// StopPause pauses each one first (a host that is going away).
	StopPause
	// StopKill kills each one and removes its record.
	StopKill
)
