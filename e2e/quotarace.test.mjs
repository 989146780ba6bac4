// A team's quota across API servers, over TLS: the cases are
// quotarace.cases.mjs, run in a child node that trusts the cluster's CA
// (lib/cluster-ca.mjs), as the API servers serve HTTPS with a certificate
// of it.

import { runWithClusterCA } from './lib/cluster-ca.mjs'

await runWithClusterCA(new URL('./quotarace.cases.mjs', import.meta.url))
