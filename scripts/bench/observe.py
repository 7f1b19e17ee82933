"""What the host sees of a running job: docker's times, the containers' log lines as they
arrive, the files the ranks write, and the machine itself."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import docker
from scripts.bench.results import Machine
from scripts.local.cluster import Cluster

LINE = re.compile(r"BENCH (first|ready|tick)\b(.*?)\bt=([0-9.]+)")
FIELD = re.compile(r"(\w+)=(\S+)")
PREFLIGHT_OK = re.compile(r"preflight ok on \S+: .*; in ([0-9.]+) s\b")


@dataclass(frozen=True)
class Event:
    """One `BENCH` line of the job (scripts/bench/job.py)."""

    kind: str  # first, ready or tick
    host: str
    rank: int | None
    seq: int
    world: int
    t: float  # the time the rank printed it (embedded in the line)
    arrival: float  # the time the line arrived on the container's stdout


def docker_time(stamp: str) -> float:
    """docker's RFC 3339 time with nanoseconds (UTC) as epoch seconds."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    moment = dt.datetime.fromisoformat(whole).replace(tzinfo=dt.UTC).timestamp()
    return moment + float("0." + (fraction or "0"))


def parse_event(host: str, arrival: float, line: str) -> Event | None:
    match = LINE.search(line)
    if not match:
        return None
    fields = dict(FIELD.findall(match.group(2)))
    return Event(
        kind=match.group(1),
        host=host,
        rank=int(fields["rank"]) if "rank" in fields else None,
        seq=int(fields.get("seq", -1)),
        world=int(fields.get("world", 0)),
        t=float(match.group(3)),
        arrival=arrival,
    )


class LogTap:
    """`docker logs --follow` of every container, each complete line with its arrival time."""

    def __init__(self, cluster: Cluster) -> None:
        self.lines: list[tuple[str, float, str]] = []  # host, arrival, line
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._follow, args=(host, c), daemon=True)
            for host, c in cluster.containers
        ]
        for thread in self.threads:
            thread.start()

    def _follow(self, host: str, container: Any) -> None:
        pending = b""
        try:
            for chunk in container.logs(stream=True, follow=True):
                now = time.time()
                pending += chunk
                *complete, pending = pending.split(b"\n")
                with self.lock:
                    self.lines += [(host, now, x.decode(errors="replace")) for x in complete]
        except Exception:  # the container was removed under us
            return

    def preflight_seconds(self) -> list[float]:
        """What each host's preflight took, as its `preflight ok on HOST: ...; in X s` says."""
        with self.lock:
            lines = [line for _, _, line in self.lines]
        return [float(m.group(1)) for m in map(PREFLIGHT_OK.search, lines) if m]

    def events(self) -> list[Event]:
        with self.lock:
            lines = list(self.lines)
        return [e for e in (parse_event(*line) for line in lines) if e is not None]


def tail(cluster: Cluster) -> str:
    """The last log lines of every container, for an error report."""
    parts = []
    for host, container in getattr(cluster, "containers", []):
        try:
            text = container.logs(tail=25).decode(errors="replace")
        except Exception as error:
            text = f"(no logs: {error})"
        parts.append(f"--- {host}\n{text}")
    return "\n".join(parts)


def started_at(cluster: Cluster) -> dict[str, float]:
    """Each host's container's docker State.StartedAt."""
    return {host: docker_time(c.attrs["State"]["StartedAt"]) for host, c in reloaded(cluster)}


def reloaded(cluster: Cluster) -> list[tuple[str, Any]]:
    for _, container in cluster.containers:
        container.reload()
    return list(cluster.containers)


def any_exited(cluster: Cluster) -> bool:
    return any(c.status == "exited" for _, c in reloaded(cluster))


def all_exited(cluster: Cluster) -> bool:
    return all(c.status == "exited" for _, c in reloaded(cluster))


def json_files(cluster: Cluster, pattern: str) -> list[dict[str, Any]]:
    """The JSON files the ranks wrote to output/data, every host's."""
    found = []
    for host in cluster.hosts:
        for path in sorted((cluster.tree(host) / "output" / "data").glob(pattern)):
            found.append(json.loads(path.read_text()))
    return found


def cleanup(cluster: Cluster) -> None:
    try:
        cluster.cleanup()
    except Exception as error:  # e.g. the engine restarted under us: nothing left to remove
        print(f"cleanup: {type(error).__name__}: {error}", file=sys.stderr)


def wait_for_engine(client: Any, seconds: float = 300) -> None:
    """Another job on this machine may restart the docker engine: wait for it to answer."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            client.ping()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def machine() -> Machine:
    mem_kb = 0
    cpu = platform.processor() or "unknown"
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    server = docker.from_env().version()
    return Machine(
        cpus=str(os.cpu_count()),
        cpu=cpu,
        memory=f"{mem_kb / 1024**2:.1f} GiB",
        kernel=platform.release(),
        docker=f"{server.get('Version')} (API {server.get('ApiVersion')})",
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )
