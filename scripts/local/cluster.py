"""A local SageMaker-like cluster: one container per host on a user-defined docker network.

Each container gets its own /opt/ml tree (resourceconfig.json, hyperparameters.json,
inputdataconfig.json, channels) bind-mounted, is reachable by its algo-N name as a network
alias (its own hostname stays docker's random one, as on SageMaker), and runs `train`.
Used by `make demo`, `make bench` (scripts/bench) and the docker tests.

    python -m scripts.local.cluster --image IMAGE --hosts 2 --script examples/hf_trainer_tiny.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import urllib3

import docker


@dataclass
class HostResult:
    host: str
    tree: Path
    exit_code: int
    logs: str
    seconds: float
    finished_at: str = ""  # docker's State.FinishedAt (RFC 3339, UTC)


@dataclass
class Cluster:
    image: str
    root: Path
    hosts: tuple[str, ...] = ("algo-1", "algo-2")
    hyperparameters: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    channels: dict[str, dict[str, bytes]] = field(default_factory=dict)
    code: dict[str, bytes] = field(default_factory=dict)
    command: list[str] | None = field(default_factory=lambda: ["train"])
    interface: str = "eth0"
    shm_size: str | None = "1g"  # None: docker's own default (64 MiB)
    # instance groups in the file's order: (name, its hosts as listed); empty: one group of
    # every host, as SageMaker writes a homogeneous job's file
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def tree(self, host: str) -> Path:
        return self.root / host / "ml"

    def _write_tree(self, host: str) -> Path:
        base = self.tree(host)
        config = base / "input" / "config"
        config.mkdir(parents=True, exist_ok=True)
        groups = self.groups or (("homogeneousCluster", tuple(reversed(self.hosts))),)
        current = next(name for name, members in groups if host in members)
        resource = {
            "current_host": host,
            "current_instance_type": "ml.c5.xlarge",
            "current_group_name": current,
            "hosts": list(self.hosts),
            "instance_groups": [
                {
                    "instance_group_name": name,
                    "instance_type": "ml.c5.xlarge",
                    "hosts": list(members),
                }
                for name, members in groups
            ],
            "network_interface_name": self.interface,
        }
        (config / "resourceconfig.json").write_text(json.dumps(resource))
        (config / "hyperparameters.json").write_text(json.dumps(self.hyperparameters))
        (config / "inputdataconfig.json").write_text(
            json.dumps(
                {
                    name: {
                        "TrainingInputMode": "File",
                        "S3DistributionType": "FullyReplicated",
                        "RecordWrapperType": "None",
                    }
                    for name in self.channels
                }
            )
        )
        for name, files in self.channels.items():
            for filename, data in files.items():
                path = base / "input" / "data" / name / filename
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        for filename, data in self.code.items():
            path = base / "code" / filename
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        for directory in ("model", "output", "checkpoints"):
            (base / directory).mkdir(exist_ok=True)
        return base

    def start(self, stream: bool = False) -> None:
        """Create the network and one container per host, then start them all."""
        self.client = docker.from_env()
        suffix = uuid.uuid4().hex[:8]
        self.network = self.client.networks.create(f"ce-cluster-{suffix}", driver="bridge")
        self.containers: list[tuple[str, Any]] = []
        for host in self.hosts:
            base = self._write_tree(host)
            container = self.client.containers.create(
                self.image,
                command=self.command,
                name=f"ce-{host}-{suffix}",
                environment=self.environment,
                volumes={str(base): {"bind": "/opt/ml", "mode": "rw"}},
                network=self.network.name,
                shm_size=self.shm_size,
            )
            self.network.disconnect(container)  # reconnect with the algo-N alias
            self.network.connect(container, aliases=[host])
            self.containers.append((host, container))
        self.started = time.monotonic()
        for _, container in self.containers:
            container.start()
        self.printers = (
            [
                threading.Thread(target=_stream, args=(host, c), daemon=True)
                for host, c in self.containers
            ]
            if stream
            else []
        )
        for printer in self.printers:
            printer.start()

    def stop(self, timeout: int = 30) -> None:
        """`docker stop` every host at once (SIGTERM, SIGKILL after `timeout`)."""
        stoppers = [
            threading.Thread(target=c.stop, kwargs={"timeout": timeout}) for _, c in self.containers
        ]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()

    def wait(self, timeout: float = 300) -> list[HostResult]:
        """Wait for every container to exit (killing one that outlives `timeout`)."""
        results = []
        for host, container in self.containers:
            remaining = max(1.0, timeout - (time.monotonic() - self.started))
            try:
                status = container.wait(timeout=remaining)["StatusCode"]
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError) as error:
                if not _read_timed_out(error):
                    raise
                container.kill()  # the host hung
                status = -1
            container.reload()
            finished = container.attrs["State"].get("FinishedAt", "")
            results.append(
                HostResult(
                    host,
                    self.tree(host),
                    status,
                    container.logs(stdout=True, stderr=True).decode(errors="replace"),
                    time.monotonic() - self.started,
                    finished,
                )
            )
        for printer in self.printers:
            printer.join(timeout=5)
        return results

    def cleanup(self) -> None:
        for _, container in getattr(self, "containers", []):
            container.remove(force=True)
        if getattr(self, "network", None) is not None:
            self.network.remove()

    def run(self, timeout: float = 300, stream: bool = False) -> list[HostResult]:
        """Start every host's container, wait for all to exit, collect logs; clean up."""
        try:
            self.start(stream=stream)
            return self.wait(timeout)
        finally:
            self.cleanup()


def _read_timed_out(error: requests.exceptions.RequestException) -> bool:
    """Whether docker-py's wait gave up: requests raises ReadTimeout over TCP, but over the
    engine's unix socket a ConnectionError that wraps urllib3's ReadTimeoutError."""
    return isinstance(error, requests.exceptions.ReadTimeout) or any(
        isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in error.args
    )


def _stream(host: str, container: Any) -> None:
    for chunk in container.logs(stream=True, follow=True):
        for line in chunk.decode(errors="replace").splitlines():
            print(f"{host} | {line}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--workers-per-host", default="2")
    parser.add_argument("--script", type=Path, default=Path("examples/hf_trainer_tiny.py"))
    parser.add_argument("--data", type=Path, help="a .jsonl file for the train channel")
    parser.add_argument(
        "--hp",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="hyperparameter, JSON-encoded like SDK v2 framework estimators",
    )
    parser.add_argument("--keep", action="store_true", help="keep the /opt/ml trees")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="ce-cluster-"))
    hps = {k: json.dumps(_literal(v)) for k, v in (item.split("=", 1) for item in args.hp)}
    hps["sagemaker_program"] = json.dumps(args.script.name)
    channels = {"train": {args.data.name: args.data.read_bytes()}} if args.data else {}
    cluster = Cluster(
        image=args.image,
        root=root,
        hosts=tuple(f"algo-{i + 1}" for i in range(args.hosts)),
        hyperparameters=hps,
        environment={"PET_NPROC_PER_NODE": args.workers_per_host},
        channels=channels,
        code={args.script.name: args.script.read_bytes()},
    )
    results = cluster.run(stream=True)
    print("\n=== summary ===")
    for result in results:
        print(f"{result.host}: exit {result.exit_code} after {result.seconds:.1f} s")
        for path in sorted((result.tree / "output" / "data").glob("rank-*.json")):
            rank = json.loads(path.read_text())
            print(
                f"  rank {rank['rank']}/{rank['world_size']} on {rank['host']}: "
                f"loss {rank['first_loss']:.4f} -> {rank['last_loss']:.4f} "
                f"({rank['parallel_mode']})"
            )
        models = sorted(p.name for p in (result.tree / "model").iterdir())
        print(f"  /opt/ml/model: {', '.join(models) or '(empty)'}")
    if args.keep:
        print(f"trees kept under {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if all(r.exit_code == 0 for r in results) else 1


def _literal(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


if __name__ == "__main__":
    sys.exit(main())
