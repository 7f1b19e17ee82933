"""Which of the job's hosts joined, finished or vanished, at the master."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from container_entry.hosts.peer import Peer


class Roster:
    """The job's hosts as the master sees them. The loop thread changes it; the master's main
    thread reads it (`has_joined`, `missing`, `unfinished`): both under `lock`."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.hosts = tuple(hosts)
        self.joined: dict[str, Peer] = {}
        self.finished: set[str] = set()  # done, left or gone silent: nothing more to wait for
        self.vanished: dict[str, str] = {}  # host -> what happened
        self.started = False  # every host joined and was told so
        self.lock = threading.Lock()

    def has_joined(self, host: str) -> bool:
        """A host joins once: members never join again, so a second join is not the host's."""
        with self.lock:
            return host in self.joined

    def missing(self) -> list[str]:
        with self.lock:
            return [h for h in self.hosts if h not in self.joined]

    def unfinished(self) -> set[str]:
        """Hosts that joined and have not finished, left or gone silent yet."""
        with self.lock:
            return set(self.joined) - self.finished

    def all_finished(self) -> bool:
        with self.lock:
            return self.finished >= set(self.joined)

    def join(self, peer: Peer) -> bool:
        """Add an admitted host; whether every host has joined now."""
        assert peer.host is not None
        with self.lock:
            self.joined[peer.host] = peer
            return len(self.joined) == len(self.hosts)

    def finish(self, peer: Peer) -> None:
        """A host said it is done."""
        assert peer.host is not None
        with self.lock:
            self.finished.add(peer.host)

    def leave(self, peer: Peer, detail: str, *, failed: bool) -> bool:
        """A host's connection ended (`detail`); whether that is news, a failure of the job: it
        neither finished nor posted a failure, and the job had not `failed` already (after a
        failure every host leaves)."""
        host = peer.host
        with self.lock:
            if host is None or self.joined.get(host) is not peer:
                return False
            self.finished.add(host)
            news = not (peer.said_done or peer.posted or failed)
            if news:
                self.vanished[host] = detail
        return news

    def open_peers(self) -> list[Peer]:
        return [p for p in self.joined.values() if p.open]

    def machines(self) -> dict[str, list[int]]:
        """boot id -> [hosts, workers] of this job on that machine: several hosts on one
        kernel (SageMaker local mode) share its cores."""
        machines: dict[str, list[int]] = {}
        for peer in self.open_peers():
            if peer.machine:
                tally = machines.setdefault(peer.machine, [0, 0])
                tally[0] += 1
                tally[1] += peer.workers
        return machines
