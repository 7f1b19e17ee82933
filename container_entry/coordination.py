"""A job-wide side channel between the bootstraps of all hosts, hosted by the master's.

torchrun has no way to tell a healthy host that another host failed: the healthy one keeps
training until a collective times out, or waits at the exit barrier for 300 s. Here every host
keeps one TCP connection to the master's bootstrap. Before launch the master waits until every
host has joined (so a host that never comes is reported before any worker starts); when any
host fails it posts the failure and the master relays it to all, so every host stops within
seconds and names the rank that failed first. Newline-delimited JSON; stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from container_entry.errors import NetworkError


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


def _lines(sock: socket.socket):
    buffer = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                yield json.loads(line)
            except ValueError:
                continue


class Coordinator:
    """Runs in the master's bootstrap: collects joins and relays the first failure."""

    def __init__(self, hosts: Sequence[str], port: int) -> None:
        self.hosts = tuple(hosts)
        self.joined: dict[str, socket.socket] = {}
        self.finished: set[str] = set()
        self.first_failure: dict[str, Any] | None = None
        self.lock = threading.Lock()
        self.all_joined = threading.Event()
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # a previous run's connections in TIME_WAIT must not make the port look busy
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.server.bind(("0.0.0.0", port))
        except OSError as error:
            self.server.close()
            raise NetworkError(
                f"coordination port {port} on the master host is in use ({error.strerror}): "
                "set CONTAINER_ENTRY_MASTER_PORT to a free port (this uses it + 1)"
            ) from None
        self.server.listen(len(self.hosts) + 4)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        host = None
        for message in _lines(connection):
            kind = message.get("type")
            if kind == "join" and message.get("host") in self.hosts:
                host = message["host"]
                with self.lock:
                    self.joined[host] = connection
                    if len(self.joined) == len(self.hosts):
                        self.all_joined.set()
                        for peer in self.joined.values():
                            _safe_send(peer, {"type": "start"})
            elif kind == "failed":
                self.relay_failure(message)
            elif kind == "done" and host:
                with self.lock:
                    self.finished.add(host)
        if host:
            with self.lock:
                self.finished.add(host)  # gone: done, failed or stopped, nothing to wait for

    def relay_failure(self, failure: dict[str, Any]) -> None:
        with self.lock:
            if self.first_failure is not None:
                return
            self.first_failure = failure
            peers = list(self.joined.values())
        for peer in peers:
            _safe_send(peer, {"type": "abort", "failure": failure})

    def missing(self) -> list[str]:
        with self.lock:
            return [h for h in self.hosts if h not in self.joined]

    def wait_finished(self, timeout: float) -> None:
        """Keep serving until every host reported done or closed its connection (bounded), so a
        relayed failure reaches every host before the master's bootstrap exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.finished >= set(self.joined):
                    return
            time.sleep(0.1)

    def close(self) -> None:
        self.server.close()
        with self.lock:
            for peer in self.joined.values():
                with contextlib.suppress(OSError):
                    peer.close()


def _safe_send(sock: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        _send(sock, message)


class Member:
    """Runs in every host's bootstrap (the master's too): joins, hears aborts, posts failures."""

    def __init__(self, host: str, master: str, port: int) -> None:
        self.host = host
        self.master = master
        self.port = port
        self.sock: socket.socket | None = None
        self.started = threading.Event()
        self.abort: dict[str, Any] | None = None
        self.aborted = threading.Event()
        self.finished = False

    def join(self, timeout: float) -> None:
        """Connect (retrying), then wait until the master says every host joined."""
        deadline = time.monotonic() + timeout
        while self.sock is None:
            try:
                self.sock = socket.create_connection((self.master, self.port), timeout=5)
                self.sock.settimeout(None)
            except OSError:
                if time.monotonic() >= deadline:
                    raise NetworkError(
                        f"could not reach the master host {self.master}:{self.port} "
                        f"within {timeout:g} s"
                    ) from None
                time.sleep(0.5)
        _send(self.sock, {"type": "join", "host": self.host})
        threading.Thread(target=self._listen, daemon=True).start()
        while not self.started.is_set():
            if self.aborted.is_set():
                if "lost_master" in (self.abort or {}):
                    raise NetworkError(f"the master host {self.master} went away during the join")
                return  # a host already failed: the caller reports it without launching
            if time.monotonic() >= deadline:
                raise NetworkError(f"not every host joined the job within {timeout:g} s")
            self.started.wait(0.1)

    def _listen(self) -> None:
        assert self.sock is not None
        for message in _lines(self.sock):
            if message.get("type") == "start":
                self.started.set()
            elif message.get("type") == "abort":
                self.abort = message.get("failure") or {}
                self.aborted.set()
        if not self.finished and not self.aborted.is_set():
            self.abort = {"lost_master": self.master}
            self.aborted.set()

    def post_failure(self, failure: dict[str, Any]) -> None:
        if self.sock is not None:
            _safe_send(self.sock, {"type": "failed", **failure})

    def done(self) -> None:
        self.finished = True
        if self.sock is not None:
            _safe_send(self.sock, {"type": "done", "host": self.host})

    def close(self) -> None:
        self.finished = True
        if self.sock is not None:
            # shutdown() sends the FIN even while the listener thread sits in recv(); a bare
            # close() leaves the master waiting for this host until its timeout
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self.sock.close()
