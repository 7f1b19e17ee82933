"""The job's hosts: waiting for their names (`network`) and a side channel between the
bootstraps of all hosts, hosted by the master's (`session`: this host's part in it).

torchrun has no way to tell a healthy host that another host failed: the healthy one keeps
training until a collective times out, or waits at the exit barrier for 300 s. Here every host
keeps one TCP connection to the master's bootstrap. Before launch the master waits until every
host has joined (so a host that never comes is reported before any worker starts); when any
host fails it posts the failure and the master relays it to all, so every host stops within
seconds and names the rank that failed first.

Liveness: both ends send heartbeats and a peer silent for `LIVENESS_TIMEOUT` is gone; a killed
one is noticed at once (hosts.liveness, docs/liveness.md). The master relays a vanished
host as a failure of the job naming it; a member that loses the master stops the same way.

Trust: the master listens on every interface, so anything in the job's subnets can connect.
Only the job's own hosts take part: a challenge-response on the job key, which never crosses
the network (hosts.keys, hosts.handshake), then an address check, and every
message checked against its schema with size caps (hosts.messages); a host speaks only
for itself, and a refused connection is closed and logged without touching any other
(hosts.admission).

The master serves every host from one thread (a selector loop), so its cost stays flat in the
number of hosts and a host that stops reading can never block it. Newline-delimited JSON;
stdlib. Its modules, one per concern:

- `wire`: message kinds (`MessageKind`), framing into bounded lines, parsing, encoding
- `schema`: checks of untrusted values and of the relayed failure record; `fitted_record`
- `messages`: every message's typed shape and its check, by direction
- `keys`: the job key and the HMAC proofs; `handshake`: both halves of the challenge-response
- `liveness`: heartbeat timing, the kernel's part, the master's watch (silence, hang verdict)
- the master: `master` (the Coordinator) composed of `hub` (its sockets, one thread),
  `admission` (who may join, the address check), `roster` (who joined, finished,
  vanished), `decision` (the job's first failure); `peer` is one connection there
- every host: `member` (the Member); `quota` rate-limits both ends' log lines about peers
- `session`: the choreography `job` runs through (serve, join, share the machine, post a
  failure, close) and the job key's one derivation; `network`: names and ports

The rest of the bootstrap imports what it uses from this package.

May import: common, diagnose (a hang's measures, the culprit's records), plan (the Plan a
session runs).
"""

from __future__ import annotations

from container_entry.hosts.decision import SETTLE_SECONDS
from container_entry.hosts.keys import JOB_SECRET_ENV, job_key
from container_entry.hosts.liveness import (
    HEARTBEAT_INTERVAL,
    JOIN_VERDICT_GRACE,
    LIVENESS_TIMEOUT,
)
from container_entry.hosts.master import Coordinator
from container_entry.hosts.member import Member, PeerFailure

__all__ = [
    "HEARTBEAT_INTERVAL",
    "JOB_SECRET_ENV",
    "JOIN_VERDICT_GRACE",
    "LIVENESS_TIMEOUT",
    "SETTLE_SECONDS",
    "Coordinator",
    "Member",
    "PeerFailure",
    "job_key",
]
