"""One simulated job of the liveness simulation (simulate_hosts.py): N hosts on this machine,
each the real bootstrap with a fake launcher, then one fault, and how long every other host
took to notice it.

Deciding (`Plan`: which host is the master, which one the fault hits; each host's /etc/hosts)
is kept apart from doing (`Job`: the processes, their stderr, the fault, the waits).
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.simulate.host import (
    Host,
    fail_a_rank,
    host_env,
    make_tree,
    rss_and_threads,
    with_hosts_file,
    write_fake_torchrun,
)

SCENARIOS = ("relay", "kill", "freeze", "disconnect", "freeze-master")
STEADY_S = 2.0  # a few heartbeats in steady state before the fault
NOTICE_S, EXIT_S = 60.0, 30.0  # how long the survivors get to notice it, then to exit


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Network:
    """A network namespace for the host to be cut off, with a veth pair to this one."""

    NS, OUTSIDE, INSIDE = "ce-sim", "ce-sim0", "ce-sim1"
    HERE, THERE = "10.252.0.1", "10.252.0.2"

    def __enter__(self) -> Network:
        self.__exit__()
        ip("netns", "add", self.NS)
        ip("link", "add", self.OUTSIDE, "type", "veth", "peer", "name", self.INSIDE)
        ip("link", "set", self.INSIDE, "netns", self.NS)
        ip("addr", "add", f"{self.HERE}/30", "dev", self.OUTSIDE)
        ip("link", "set", self.OUTSIDE, "up")
        ip("-n", self.NS, "addr", "add", f"{self.THERE}/30", "dev", self.INSIDE)
        ip("-n", self.NS, "link", "set", self.INSIDE, "up")
        ip("-n", self.NS, "link", "set", "lo", "up")
        return self

    def cut(self) -> None:
        ip("link", "set", self.OUTSIDE, "down")

    def __exit__(self, *_: object) -> None:
        subprocess.run(["ip", "link", "del", self.OUTSIDE], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", self.NS], check=False, capture_output=True)


@dataclass(frozen=True)
class Plan:
    """Who is who in a job of `count` hosts with fault `scenario`: hosts are ordered by name
    as the bootstrap orders them (algo-1, algo-10, ...); the master is the first, the host a
    fault hits the last (the master for freeze-master), the rank that fails a middle one."""

    count: int
    scenario: str

    @property
    def names(self) -> list[str]:
        return [f"algo-{i}" for i in range(1, self.count + 1)]

    @property
    def master(self) -> str:
        return sorted(self.names)[0]

    @property
    def victim(self) -> str:
        return self.master if self.scenario == "freeze-master" else sorted(self.names)[-1]

    @property
    def target(self) -> str:
        """The host the fault happens on."""
        ordered = sorted(self.names)
        return ordered[len(ordered) // 2] if self.scenario == "relay" else self.victim

    def hosts_file(self) -> str:
        """/etc/hosts of every host but a cut-off one: the master checks that a host connects
        from the address its name resolves to, and the host cut off sits behind its own veth
        pair."""
        cut = self.scenario == "disconnect"
        return "127.0.0.1 localhost\n" + "".join(
            f"{Network.THERE if cut and n == self.victim else '127.0.0.1'} {n}\n"
            for n in self.names
        )

    def cut_hosts_file(self) -> str:
        """/etc/hosts of the host cut off: every other host across the veth pair."""
        return (
            "127.0.0.1 localhost\n"
            + "".join(f"{Network.HERE} {n}\n" for n in self.names if n != self.victim)
            + f"{Network.THERE} {self.victim}\n"
        )


class Job:
    """The hosts of one simulated job as processes, their stderr read as it comes, the fault
    and the waits for its effects; close() leaves nothing behind."""

    def __init__(self, root: Path, plan: Plan, port: int, timeout: float) -> None:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        self.root, self.plan, self.port, self.timeout = root, plan, port, timeout
        self.local_hosts = root / "hosts"
        self.local_hosts.write_text(plan.hosts_file())
        self.fake = write_fake_torchrun(root)
        self.network = Network() if plan.scenario == "disconnect" else None
        self.hosts: list[Host] = []
        self.selector = selectors.DefaultSelector()

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def start(self) -> float:
        """Start every host's bootstrap (the cut-off one in the network namespace); the time
        they were started."""
        cut_hosts = self.root / "hosts-cut"
        if self.network:
            self.network.__enter__()
            cut_hosts.write_text(self.plan.cut_hosts_file())
        started = time.time()
        for name in self.plan.names:
            base = make_tree(self.root, name, self.plan.names)
            argv = [sys.executable, "-m", "container_entry", "train"]
            if self.network and name == self.plan.victim:
                argv = ["ip", "netns", "exec", Network.NS, *with_hosts_file(argv, cut_hosts)]
            else:
                argv = with_hosts_file(argv, self.local_hosts)
            process = subprocess.Popen(
                argv,
                env=host_env(base, self.fake, self.port, self.timeout),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd="/",
                start_new_session=True,
            )
            host = Host(name, base, process)
            self.hosts.append(host)
            assert process.stderr is not None
            os.set_blocking(process.stderr.fileno(), False)
            self.selector.register(process.stderr, selectors.EVENT_READ, host)
        return started

    def pump(self, wait: float) -> None:
        """Read what the hosts wrote to stderr, waiting up to `wait` s for any."""
        for key, _ in self.selector.select(wait):
            host: Host = key.data
            stream = host.process.stderr
            assert stream is not None
            with contextlib.suppress(BlockingIOError):
                data = stream.read(65536)
                if not data:
                    self.selector.unregister(stream)
                else:
                    host.lines.extend(data.decode(errors="replace").splitlines())

    def wait_launched(self) -> None:
        """Until every host joined and runs its (fake) launcher; RuntimeError on a host that
        exited or after the timeout."""
        deadline = time.monotonic() + self.timeout
        while not all(h.read("sim-launched.json") for h in self.hosts):
            if time.monotonic() > deadline or any(h.process.poll() is not None for h in self.hosts):
                gone = [h for h in self.hosts if h.process.poll() is not None]
                detail = "\n".join(gone[0].lines[-5:]) if gone else "timeout"
                raise RuntimeError(f"the job of {self.plan.count} did not start: {detail}")
            self.pump(0.2)

    def fault(self) -> float:
        """The plan's fault, now; when it happened."""
        target = self.host(self.plan.target)
        if self.plan.scenario == "relay":
            return fail_a_rank(target)
        fault_at = time.time()
        if self.plan.scenario == "kill":
            os.kill(target.process.pid, signal.SIGKILL)
        elif self.plan.scenario in ("freeze", "freeze-master"):
            os.kill(target.process.pid, signal.SIGSTOP)
        else:
            assert self.network is not None
            self.network.cut()
        return fault_at

    def survivors(self) -> list[Host]:
        return [h for h in self.hosts if h.name != self.plan.target]

    def noticed(self, fault_at: float) -> dict:
        """How many survivors' bootstraps told their launcher to stop, and how fast."""
        survivors = self.survivors()
        deadline = time.monotonic() + NOTICE_S
        while time.monotonic() < deadline and not all(h.read("sim-term.json") for h in survivors):
            self.pump(0.1)
        told = [h.read("sim-term.json") for h in survivors]
        delays = sorted(t["at"] - fault_at for t in told if t)
        return {
            "noticed_by": f"{len(delays)}/{len(survivors)}",
            "noticed_max_s": round(delays[-1], 2) if delays else None,
            "noticed_median_s": round(delays[len(delays) // 2], 2) if delays else None,
        }

    def exited(self, fault_at: float) -> dict:
        """Every survivor's bootstrap exits, non-zero, naming what happened (its failure
        file's first line)."""
        survivors = self.survivors()
        exited: dict[str, float] = {}
        deadline = time.monotonic() + EXIT_S
        while time.monotonic() < deadline and len(exited) < len(survivors):
            for host in survivors:
                if host.name not in exited and host.process.poll() is not None:
                    exited[host.name] = time.time()
            self.pump(0.05)
        codes = [h.process.poll() for h in survivors]
        reasons = set()
        for host in survivors:
            with contextlib.suppress(OSError):
                line = (host.base / "output" / "failure").read_text().splitlines()[0]
                reasons.add(re.sub(r"( \[first failure\]|; algo-\d+ stopped.*)$", "", line))
        return {
            "exited_max_s": round(max(exited.values()) - fault_at, 2) if exited else None,
            "survivors_exited": sum(c is not None for c in codes),
            "survivors_nonzero": sum(bool(c) for c in codes if c is not None),
            "reasons": sorted(reasons)[:3],
        }

    def close(self) -> None:
        """Kill every host (a frozen one too), the network namespace and the tree. The
        launchers run in the bootstrap's session: gone with it; nothing else is left."""
        for host in self.hosts:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(host.process.pid, signal.SIGCONT)
                os.killpg(host.process.pid, signal.SIGKILL)
        for host in self.hosts:
            with contextlib.suppress(subprocess.TimeoutExpired):
                host.process.wait(timeout=10)
        self.selector.close()
        if self.network:
            self.network.__exit__()
        shutil.rmtree(self.root, ignore_errors=True)


def run_job(count: int, scenario: str, port: int, work: Path, timeout: float) -> dict:
    """One job of `count` hosts and one fault; returns the measurements."""
    plan = Plan(count, scenario)
    job = Job(work / f"{count}-{scenario}", plan, port, timeout)
    result: dict = {"hosts": count, "scenario": scenario}
    try:
        started = job.start()
        job.wait_launched()
        result["start_s"] = round(time.time() - started, 1)
        rss, threads = rss_and_threads(job.host(plan.master).process.pid)
        result["master_rss_mb"], result["master_threads"] = round(rss, 1), threads
        time.sleep(STEADY_S)
        fault_at = job.fault()
        result.update(job.noticed(fault_at))
        result.update(job.exited(fault_at))
        return result
    finally:
        job.close()
