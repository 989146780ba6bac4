// Many hosts on one machine, over TLS: the cases are multihost.cases.mjs.
// The API servers serve HTTPS with a certificate of the cluster's CA, so
// the cases run in a child node that trusts it (lib/cluster-ca.mjs).

import { runWithClusterCA } from './lib/cluster-ca.mjs'

await runWithClusterCA(new URL('./multihost.cases.mjs', import.meta.url))
