"""Simulate a job of N hosts on one machine: the real, unmodified bootstrap on every host.

Each host is one real `python -m container_entry train` process with its own /opt/ml tree
(SageMaker's resourceconfig.json naming algo-1..algo-N) and a private /etc/hosts resolving every
algo-K to this machine (a mount namespace: needs root and `unshare`). Only the launcher is fake:
a `torch.distributed.run` module on PYTHONPATH that starts no worker; it idles like a training
torchrun and on SIGTERM (the bootstrap stopping it) writes the time it was told, then exits.
Everything else, the plan, the name wait, the side channel (Coordinator on algo-1, a Member
on every host), the monitor and the verdict, is the code the image runs.

Scenarios, each on a fresh job once every host's launcher runs (a host "noticed" a fault when
its bootstrap signalled its launcher to stop; the figure is the slowest of the hosts):

  relay       a rank on one host fails (its record appears, as a worker's wrapper writes it):
              relayed to every other host
  kill        one host's bootstrap is killed (SIGKILL)
  freeze      one host's bootstrap is frozen (SIGSTOP): its socket stays open, only the
              heartbeats tell
  disconnect  one host is cut off the network: it runs in its own network namespace joined
              to this one by a veth pair, whose link goes down (needs `ip`)
  freeze-master  the master's bootstrap is frozen: every member must notice by itself

    sudo python scripts/simulate_hosts.py --hosts 2 16 64 256 [--scenarios relay kill ...]
        [--json results.json]

Prints one row per host count: the time to notice each fault, the master's threads and memory
(RSS) once every host joined, and how long the start took.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from container_entry.plan import run_dir
from scripts import doc_block

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = ("relay", "kill", "freeze", "disconnect", "freeze-master")
DOCS_BEGIN, DOCS_END = "<!-- generated: make bench-liveness -->", "<!-- end generated -->"

FAKE_TORCHRUN = r'''
"""Stand-in for torchrun (simulate_hosts.py): no worker, the records a worker would leave.
Imported first, run when launched (as the bootstrap starts torchrun: container_entry.launch)."""
import json, os, signal, sys, time


def main(args=None):
    control = os.environ["_CONTAINER_ENTRY_CONTROL"]
    with open(os.path.join(control, "command.json")) as handle:
        run_dir = json.load(handle)["run_dir"]

    def write(name, data):
        path = os.path.join(run_dir, name)
        with open(path + ".tmp", "w") as handle:
            json.dump(data, handle)
        os.replace(path + ".tmp", path)

    def on_term(signum, frame):
        write("sim-term.json", {"at": time.time()})
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    write("sim-launched.json", {"at": time.time(), "pid": os.getpid()})
    while True:  # training, as far as the bootstrap can tell
        time.sleep(3600)


if __name__ == "__main__":
    main()
'''


@dataclass
class Host:
    name: str
    base: Path
    process: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return run_dir(self.base)

    def read(self, name: str) -> dict | None:
        try:
            return json.loads((self.run_dir / name).read_text())
        except (OSError, ValueError):
            return None


def make_tree(root: Path, host: str, hosts: list[str]) -> Path:
    base = root / host / "ml"
    config = base / "input" / "config"
    config.mkdir(parents=True)
    resource = {"current_host": host, "hosts": hosts, "network_interface_name": "lo"}
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    (config / "hyperparameters.json").write_text("{}")
    (config / "inputdataconfig.json").write_text("{}")
    (base / "code").mkdir()
    (base / "code" / "train.py").write_text(
        "raise SystemExit('never runs: the launcher is fake')\n"
    )
    return base


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


def with_hosts_file(argv: list[str], hosts_file: Path) -> list[str]:
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--", "sh", "-c", script, str(hosts_file), *argv]


def rss_and_threads(pid: int) -> tuple[float, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def run_job(count: int, scenario: str, port: int, work: Path, timeout: float) -> dict:
    """One job of `count` hosts and one fault; returns the measurements."""
    root = work / f"{count}-{scenario}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    names = [f"algo-{i}" for i in range(1, count + 1)]
    ordered = sorted(names)
    master_name = ordered[0]
    victim = master_name if scenario == "freeze-master" else ordered[-1]
    local_hosts = root / "hosts"
    # the master checks that a host connects from the address its name resolves to: the host
    # cut off below sits behind its own veth pair
    local_hosts.write_text(
        "127.0.0.1 localhost\n"
        + "".join(
            f"{Network.THERE if scenario == 'disconnect' and n == victim else '127.0.0.1'} {n}\n"
            for n in names
        )
    )
    fake = root / "fake"
    (fake / "torch" / "distributed").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("")
    (fake / "torch" / "distributed" / "__init__.py").write_text("")
    (fake / "torch" / "distributed" / "run.py").write_text(FAKE_TORCHRUN)
    network = Network() if scenario == "disconnect" else None
    hosts: list[Host] = []
    selector = selectors.DefaultSelector()
    result: dict = {"hosts": count, "scenario": scenario}
    try:
        if network:
            network.__enter__()
            cut_hosts = root / "hosts-cut"
            cut_hosts.write_text(
                "127.0.0.1 localhost\n"
                + "".join(f"{Network.HERE} {n}\n" for n in names if n != victim)
                + f"{Network.THERE} {victim}\n"
            )
        started = time.time()
        for name in names:
            base = make_tree(root, name, names)
            env = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("SM_", "PET_", "SAGEMAKER_", "CONTAINER_ENTRY_"))
            }
            env.update(
                SAGEMAKER_BASE_DIR=str(base),
                SAGEMAKER_PROGRAM="train.py",
                PYTHONPATH=f"{fake}:{REPO}",
                CONTAINER_ENTRY_MASTER_PORT=str(port),
                CONTAINER_ENTRY_PREFLIGHT="false",
                CONTAINER_ENTRY_JOIN_TIMEOUT=str(timeout),
                CONTAINER_ENTRY_FAILURE_GRACE_PERIOD="2",
            )
            argv = [sys.executable, "-m", "container_entry", "train"]
            if network and name == victim:
                argv = ["ip", "netns", "exec", Network.NS, *with_hosts_file(argv, cut_hosts)]
            else:
                argv = with_hosts_file(argv, local_hosts)
            process = subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd="/",
                start_new_session=True,
            )
            host = Host(name, base, process)
            hosts.append(host)
            assert process.stderr is not None
            os.set_blocking(process.stderr.fileno(), False)
            selector.register(process.stderr, selectors.EVENT_READ, host)

        by_name = {h.name: h for h in hosts}

        def pump(wait: float) -> None:
            for key, _ in selector.select(wait):
                with contextlib.suppress(BlockingIOError):
                    data = key.fileobj.read(65536)  # type: ignore[union-attr]
                    if not data:
                        selector.unregister(key.fileobj)
                    else:
                        key.data.lines.extend(data.decode(errors="replace").splitlines())

        # every host joined and runs its (fake) launcher
        deadline = time.monotonic() + timeout
        while not all(h.read("sim-launched.json") for h in hosts):
            if time.monotonic() > deadline or any(h.process.poll() is not None for h in hosts):
                gone = [h for h in hosts if h.process.poll() is not None]
                detail = "\n".join(gone[0].lines[-5:]) if gone else "timeout"
                raise RuntimeError(f"the job of {count} did not start: {detail}")
            pump(0.2)
        result["start_s"] = round(time.time() - started, 1)
        master = by_name[master_name]
        rss, threads = rss_and_threads(master.process.pid)
        result["master_rss_mb"], result["master_threads"] = round(rss, 1), threads
        time.sleep(2.0)  # a few heartbeats in steady state

        target = by_name[victim] if scenario != "relay" else by_name[ordered[len(ordered) // 2]]
        survivors = [h for h in hosts if h is not target]
        if scenario == "relay":
            fault_at = fail_a_rank(target)
        elif scenario == "kill":
            fault_at = time.time()
            os.kill(target.process.pid, signal.SIGKILL)
        elif scenario in ("freeze", "freeze-master"):
            fault_at = time.time()
            os.kill(target.process.pid, signal.SIGSTOP)
        else:
            assert network is not None
            fault_at = time.time()
            network.cut()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(h.read("sim-term.json") for h in survivors):
            pump(0.1)
        told = [h.read("sim-term.json") for h in survivors]
        delays = sorted(t["at"] - fault_at for t in told if t)
        result["noticed_by"] = f"{len(delays)}/{len(survivors)}"
        result["noticed_max_s"] = round(delays[-1], 2) if delays else None
        result["noticed_median_s"] = round(delays[len(delays) // 2], 2) if delays else None
        # every survivor's bootstrap exits, non-zero, naming what happened
        exited: dict[str, float] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(exited) < len(survivors):
            for host in survivors:
                if host.name not in exited and host.process.poll() is not None:
                    exited[host.name] = time.time()
            pump(0.05)
        codes = [h.process.poll() for h in survivors]
        result["exited_max_s"] = round(max(exited.values()) - fault_at, 2) if exited else None
        result["survivors_exited"] = sum(c is not None for c in codes)
        result["survivors_nonzero"] = sum(bool(c) for c in codes if c is not None)
        reasons = set()
        for host in survivors:
            with contextlib.suppress(OSError):
                line = (host.base / "output" / "failure").read_text().splitlines()[0]
                reasons.add(re.sub(r"( \[first failure\]|; algo-\d+ stopped.*)$", "", line))
        result["reasons"] = sorted(reasons)[:3]
        return result
    finally:
        for host in hosts:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(host.process.pid, signal.SIGCONT)
                os.killpg(host.process.pid, signal.SIGKILL)
        for host in hosts:
            with contextlib.suppress(subprocess.TimeoutExpired):
                host.process.wait(timeout=10)
        # the launchers run in the bootstrap's session: gone with it; nothing else is left
        selector.close()
        if network:
            network.__exit__()
        shutil.rmtree(root, ignore_errors=True)


def fail_a_rank(host: Host) -> float:
    """Rank 0 of `host` fails now: its record, as the worker's wrapper writes it when the
    script ends, appears in the host's run folder, where the bootstrap's monitor looks."""
    ended = time.time()
    record = {
        "host": host.name,
        "rank": 0,
        "local_rank": 0,
        "returncode": 1,
        "ended_at": ended,
        "exception": {"type": "ValueError", "message": "simulated failure"},
    }
    path = host.run_dir / "rank-0.json"
    temporary = host.run_dir / ".rank-0.json.tmp"
    temporary.write_text(json.dumps(record))
    temporary.replace(path)
    return ended


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 16, 64, 256])
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--port", type=int, default=31000)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for a job start")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument(
        "--write-docs", type=Path, metavar="PAGE", help="rewrite the generated table of PAGE"
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("needs root and unshare (a private /etc/hosts per host)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="simulate-hosts-"))
    results = []
    port = args.port
    try:
        for count in args.hosts:
            for scenario in args.scenarios:
                port += 10
                try:
                    result = run_job(count, scenario, port, work, args.timeout)
                except (RuntimeError, subprocess.CalledProcessError, OSError) as error:
                    result = {"hosts": count, "scenario": scenario, "error": str(error)}
                results.append(result)
                print(json.dumps(result), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print()
    block = "\n".join(
        [
            f"Generated by `make bench-liveness` on "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {os.cpu_count()} CPUs, "
            f"one run per host count and scenario; each cell is the slowest host "
            "(the host that noticed last).",
            "",
            table(results),
        ]
    )
    print(block)
    if args.write_docs:
        doc_block.write_block(args.write_docs, block, DOCS_BEGIN, DOCS_END)
        print(f"written: {args.write_docs}")
    return 0


def table(results: list[dict]) -> str:
    """Markdown: one row per host count; per scenario the slowest host's notice time (the
    median host's in brackets), then how many survivors noticed and exited non-zero."""
    counts = sorted({r["hosts"] for r in results})
    scenarios = [s for s in SCENARIOS if any(r["scenario"] == s for r in results)]
    head = ["hosts", *[f"{s}: noticed" for s in scenarios], "every host exited (freeze)"]
    head += ["survivors that noticed / exited non-zero", "master threads / RSS", "start"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for count in counts:
        mine = {r["scenario"]: r for r in results if r["hosts"] == count}
        cells = [str(count)]
        for scenario in scenarios:
            r = mine.get(scenario, {})
            if "error" in r or r.get("noticed_max_s") is None:
                cells.append("failed")
            else:
                cells.append(f"{r['noticed_max_s']:.2f} s ({r['noticed_median_s']:.2f})")
        frozen = mine.get("freeze", {})
        cells.append(f"{frozen['exited_max_s']:.1f} s" if frozen.get("exited_max_s") else "-")
        runs = [r for r in mine.values() if "noticed_by" in r]
        cells.append(
            ", ".join(f"{r['noticed_by']} / {r.get('survivors_nonzero', '-')}" for r in runs)
        )
        any_run = next((r for r in mine.values() if "master_threads" in r), {})
        cells.append(
            f"{any_run.get('master_threads', '-')} / {any_run.get('master_rss_mb', '-')} MB"
        )
        starts = [r["start_s"] for r in mine.values() if "start_s" in r]
        cells.append(f"{min(starts):.1f}-{max(starts):.1f} s" if starts else "-")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
