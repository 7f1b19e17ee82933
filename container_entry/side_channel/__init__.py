"""The hosts' side channel, one module per concern (the overview, and the names the rest of
the bootstrap uses: container_entry.coordination).

- `wire`: message kinds (`Kind`), framing into bounded lines, parsing, encoding
- `schema`: checks of untrusted values and of the relayed failure record; `fitted`
- `messages`: every message's typed shape and its check, by direction
- `keys`: the job key and the HMAC proofs; `handshake`: both halves of the challenge-response
- `liveness`: heartbeat timing, the kernel's part, the master's watch (silence, hang verdict)
- the master: `master` (the Coordinator) composed of `hub` (its sockets, one thread),
  `admission` (who may join; `addresses`: the address check), `roster` (who joined, finished,
  vanished), `decision` (the job's first failure); `peer` is one connection there
- every host: `member` (the Member); `quota` rate-limits both ends' log lines about peers
"""
