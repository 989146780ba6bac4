// The tests' "internet", run inside its own network namespace by
// internet.mjs: HTTP and HTTPS servers on two addresses that answer with
// their own address and the Host they were asked for, and a DNS server for
// the test domains. Usage: node internet-server.mjs CERT KEY ZONE_JSON
//
// ZONE_JSON maps names to IPv4 addresses; other names get NXDOMAIN.

import dgram from 'node:dgram'
import fs from 'node:fs'
import http from 'node:http'
import https from 'node:https'

const [certFile, keyFile, zoneJSON] = process.argv.slice(2)
const zone = JSON.parse(zoneJSON)
const addrs = [...new Set(Object.values(zone))]
const tls = { cert: fs.readFileSync(certFile), key: fs.readFileSync(keyFile) }

function answer(addr) {
  return (req, res) => {
    res.setHeader('Content-Type', 'text/plain')
    res.end(`hello from ${addr} for ${req.headers.host}\n`)
  }
}

const listening = []
for (const addr of addrs) {
  for (const port of [80, 8080]) {
    listening.push(new Promise((resolve) => http.createServer(answer(addr)).listen(port, addr, resolve)))
  }
  listening.push(new Promise((resolve) => https.createServer(tls, answer(addr)).listen(443, addr, resolve)))
}

// A DNS server of just what the tests ask: A queries of the zone's names.
function dnsReply(msg) {
  if (msg.length < 12) return null
  let off = 12
  const labels = []
  while (off < msg.length && msg[off] !== 0) {
    const n = msg[off]
    labels.push(msg.subarray(off + 1, off + 1 + n).toString('latin1'))
    off += 1 + n
  }
  const qEnd = off + 5
  if (qEnd > msg.length) return null
  const qtype = msg.readUInt16BE(off + 1)
  const name = labels.join('.').toLowerCase()
  const addr = zone[name]
  const header = Buffer.alloc(12)
  msg.copy(header, 0, 0, 2) // id
  header.writeUInt16BE(0x8180 | (addr === undefined ? 3 : 0), 2) // response, recursion available, NXDOMAIN?
  header.writeUInt16BE(1, 4) // one question
  const question = msg.subarray(12, qEnd)
  if (addr === undefined || qtype !== 1) return Buffer.concat([header, question])
  header.writeUInt16BE(1, 6) // one answer
  const rr = Buffer.alloc(16)
  rr.writeUInt16BE(0xc00c, 0) // the question's name
  rr.writeUInt16BE(1, 2) // A
  rr.writeUInt16BE(1, 4) // IN
  rr.writeUInt32BE(5, 6) // TTL
  rr.writeUInt16BE(4, 10)
  addr.split('.').forEach((b, i) => rr.writeUInt8(Number(b), 12 + i))
  return Buffer.concat([header, question, rr])
}

const dns = dgram.createSocket('udp4')
dns.on('message', (msg, rinfo) => {
  const reply = dnsReply(msg)
  if (reply) dns.send(reply, rinfo.port, rinfo.address)
})
listening.push(new Promise((resolve) => dns.bind(53, addrs[0], resolve)))

await Promise.all(listening)
console.log('internet ready')
