// Package netns gives every sandbox its own network: a pair of Linux network
// namespaces (a "slot") wired to the host, with NAT and egress rules in
// nftables. Only the node (and the runtimes it drives, through the namespace
// path) imports it.
//
// # Why two namespaces
//
// gVisor's runsc with --network=sandbox takes over every interface that has
// an address in its namespace, so nothing else (NAT, a second interface) can
// live there. A slot is therefore:
//
//	 root ns (host)                 router ns                     sandbox ns
//	┌──────────────────┐  veth   ┌──────────────────────┐ veth ┌──────────────┐
//	│ aenv<i>          ├─────────┤ uplink   HostAddr/30 │      │ lo           │
//	│ 10.231.x.y+1/30  │         │ sandbox  169.254.0.22├──────┤ eth0         │
//	│ table inet aenv  │         │ table inet aenv      │      │ 169.254.0.21 │
//	└──────────────────┘         │  DNAT HostAddr→.21   │      │ via .22      │
//	                             │  SNAT .21→HostAddr   │      └──────────────┘
//	                             │  egress filter       │
//	                             └──────────────────────┘
//
// The address inside the sandbox is the same in every slot, so snapshots of
// one sandbox can be restored side by side; HostAddr is unique per slot and
// is what the host dials to reach a port inside the sandbox (all ports are
// forwarded). Both namespaces are bind-mounted under Config.RunDir
// (<name> and <name>.router), so a runtime can put the sandbox namespace's
// path in an OCI spec and an operator can inspect either with nsenter.
//
// # Isolation
//
// A sandbox can never open connections to another sandbox, to the host's own
// addresses, to its router, or to private, shared, link-local, loopback and
// multicast ranges, nor to the cluster's members (Config.ClusterAddrs,
// whatever their addresses); with AllowInternet it may open connections to
// anything else. Only the host itself may open connections into a slot (forwarded
// traffic from other interfaces into a slot is dropped). Replies always flow.
//
// # Lifecycle
//
//	NewManager ──► Acquire ──► (runtime uses Slot.SandboxNSPath) ──► Release
//	    │             ▲                                          └─► Recycle ─┐
//	    │             └──────────────── pool ◄───────────────────────────────┘
//	    └──────────────────────────────────────────────────────────────► Close
//
// NewManager removes leftovers of a previous run (see Reap), sets up the host
// side and starts filling a pool of ready slots in the background. Acquire
// takes a slot from the pool (or builds one) and applies its egress policy.
// Release destroys a slot: its namespaces at once, its host-side interface
// in the background (the kernel spends tens of milliseconds on that). A
// sandbox namespace is single-use once runsc has run in it (runsc removes
// eth0's address), unless Recycle puts the address and route back, which
// it does only when no process is left in the namespace. Close destroys
// every slot the manager still has, including acquired ones, and removes
// the host-side rules.
//
// Measured here (2 cores, kernel 6.18, otherwise idle): building a slot
// takes about 7 ms, Acquire from the pool 15-60 µs (0.3 ms more when it
// opens egress: an nftables commit), Recycle about 1.3 ms, Release under
// 1 ms. Under heavy load on the host, all of these take several times as long.
package netns
