"""One simulated host of the liveness simulation (simulate_hosts.py): the real bootstrap with
its own /opt/ml tree and /etc/hosts, and a fake launcher (FAKE_TORCHRUN) that starts no worker
but leaves the records the simulation reads; a rank's failure planted as its wrapper would
write it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

from container_entry.common.layout import RunDir

REPO = Path(__file__).resolve().parents[2]

FAKE_TORCHRUN = r'''
"""Stand-in for torchrun (simulate_hosts.py): no worker, the records a worker would leave.
Imported first, run when launched (as the bootstrap starts torchrun: supervise/prestart.py)."""
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
    process: Popen
    lines: list[str] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return RunDir.of(self.base).path

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


def host_env(base: Path, fake: Path, port: int, timeout: float) -> dict[str, str]:
    """This process's environment without anything that would steer the bootstrap, then the
    host's: its tree, the fake launcher first on the path, the master port, short waits."""
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
    return env


def write_fake_torchrun(root: Path) -> Path:
    """A `torch.distributed.run` package of FAKE_TORCHRUN only, under `root`/fake."""
    fake = root / "fake"
    (fake / "torch" / "distributed").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("")
    (fake / "torch" / "distributed" / "__init__.py").write_text("")
    (fake / "torch" / "distributed" / "run.py").write_text(FAKE_TORCHRUN)
    return fake


def with_hosts_file(argv: list[str], hosts_file: Path) -> list[str]:
    """`argv` in a mount namespace of its own whose /etc/hosts is `hosts_file`."""
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--", "sh", "-c", script, str(hosts_file), *argv]


def rss_and_threads(pid: int) -> tuple[float, int]:
    """A process's resident memory (MiB) and its threads, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


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
