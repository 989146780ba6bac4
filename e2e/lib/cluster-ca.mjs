// Runs a test file's cases in a child node that trusts a cluster CA made
// ahead, the way the README tells SDK users to: NODE_EXTRA_CA_CERTS.
//
// A cluster whose API servers listen beyond loopback serves HTTPS with a
// certificate of its own CA, and the unmodified e2b SDK in the test
// process must trust it. Node reads NODE_EXTRA_CA_CERTS only when it
// starts (and Node 20 has no tls.setDefaultCACertificates), so the CA is
// made first (`aenv cluster ca --init`) and the cases run in a child
// process started with it. The child inherits the test runner's stdout
// and NODE_TEST_CONTEXT, so its report is the file's report; this process
// imports nothing of node:test, so that it adds none of its own.
//
//   // multihost.test.mjs
//   import { runWithClusterCA } from './lib/cluster-ca.mjs'
//   await runWithClusterCA(new URL('./multihost.cases.mjs', import.meta.url))

import { execFileSync, spawn } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

/** The environment variable naming the CA's directory, in the child. */
export const CLUSTER_CA_ENV = 'AENV_E2E_CLUSTER_CA'

/**
 * Makes a cluster CA in a new directory and runs the cases module in a
 * child node with NODE_EXTRA_CA_CERTS (and the aenv CLI's AENV_CA_FILE)
 * naming its certificate and AENV_E2E_CLUSTER_CA its directory; exits
 * with the child's status.
 */
export async function runWithClusterCA(casesURL) {
  const binDir = process.env.AENV_BIN_DIR
  if (!binDir) throw new Error('AENV_BIN_DIR is not set (it must hold the aenv and envd binaries: `make build`)')
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'aenv-e2e-ca-'))
  const caFile = path.join(dir, 'ca.crt')
  execFileSync(path.join(binDir, 'aenv'), ['cluster', 'ca', '--init', '--ca-dir', dir], { stdio: ['ignore', 'ignore', 'inherit'] })
  const child = spawn(process.execPath, [...process.execArgv, fileURLToPath(casesURL)], {
    stdio: 'inherit',
    env: { ...process.env, NODE_EXTRA_CA_CERTS: caFile, AENV_CA_FILE: caFile, [CLUSTER_CA_ENV]: dir },
  })
  // The runner stops a file's process on a timeout or a ^C: the cases
  // (and their cleanup) are the child's.
  const forward = (sig) => child.kill(sig)
  for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, forward)
  const { code, signal } = await new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })))
  fs.rmSync(dir, { recursive: true, force: true })
  process.exitCode = code ?? (signal ? 1 : 0)
}
