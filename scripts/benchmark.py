"""Benchmark ours against bare torchrun and the DLC's own launcher, side by side.

The same small job (scripts/bench_job.py) runs three ways on a 2-host local cluster
(scripts/local_cluster.py: one container per host algo-N, each with its own /opt/ml tree),
in alternation, for several rounds:

  torchrun   bare `python -m torch.distributed.run --nnodes 2 --node-rank i ...` as the command
             of the base image (no launcher of any kind around it);
  incumbent  the base image's `train` (sagemaker-training + sagemaker-pytorch-training) with
             hyperparameter sagemaker_torch_distributed_enabled=true;
  ours       our image's `train` (plus, as a fourth column, the same with its multi-host
             preflight check off: CONTAINER_ENTRY_PREFLIGHT=false).

All of them run the same world size (--procs-per-host on each of the 2 hosts) and the same
environment (ACCELERATE_USE_CPU=true so the HF Trainer runs DDP on gloo, OMP_NUM_THREADS=1).
Every figure is measured from the host: the job prints `t=<epoch>` lines and writes files;
docker gives State.StartedAt/FinishedAt; `docker logs --follow` gives line arrival times.
Results go to docs/benchmarks.md (regenerated; a GPU section written by
scripts/gpu_benchmark.py is kept) and to build/benchmark.json.

    python scripts/benchmark.py --image container-entry:bench [--rounds 4 | --quick]
    make bench [ARGS="--quick"]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from local_cluster import Cluster  # noqa: E402

JOB = REPO / "scripts" / "bench_job.py"
DOCS = REPO / "docs" / "benchmarks.md"
GPU_BEGIN, GPU_END = "<!-- gpu-results:begin -->", "<!-- gpu-results:end -->"
VARIANTS = ("torchrun", "incumbent", "ours", "ours-nopreflight")
LABELS = {
    "torchrun": "bare torchrun",
    "incumbent": "incumbent (DLC `train`)",
    "ours": "ours",
    "ours-nopreflight": "ours, preflight off",
}
HOSTS = ("algo-1", "algo-2")
COMMON_ENV = {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
LINE = re.compile(r"BENCH (first|ready|tick)\b(.*?)\bt=([0-9.]+)")
FIELD = re.compile(r"(\w+)=(\S+)")


@dataclass
class BenchCluster(Cluster):
    """Cluster with a command per host (bare torchrun needs its --node-rank on the line).

    Cluster.start() writes each host's tree and then creates that host's container with
    `self.command`, so setting the command while the tree is written gives each its own."""

    host_commands: dict[str, list[str]] = field(default_factory=dict)

    def _write_tree(self, host: str) -> Path:
        if host in self.host_commands:
            self.command = self.host_commands[host]
        return super()._write_tree(host)


@dataclass
class Config:
    image: str
    base: str
    procs: int
    ticks: int  # ticks every rank must have printed before `docker stop`
    tick_seconds: float
    fail_tick: int
    steps: int
    warmup: int
    stop_timeout: int
    fail_cap: float


def docker_time(stamp: str) -> float:
    """docker's RFC 3339 time with nanoseconds (UTC) as epoch seconds."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    moment = dt.datetime.fromisoformat(whole).replace(tzinfo=dt.timezone.utc).timestamp()
    return moment + float("0." + (fraction or "0"))


def make_cluster(variant: str, config: Config, job: dict[str, Any], root: Path) -> BenchCluster:
    """The same job, launched the variant's way."""
    code = {"bench_job.py": JOB.read_bytes()}
    env = dict(COMMON_ENV)
    if variant == "torchrun":
        argv = [f"--{key}={value}" for key, value in job.items()]
        commands = {
            host: [
                "python",
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(len(HOSTS)),
                "--nproc-per-node",
                str(config.procs),
                "--node-rank",
                str(index),
                "--master-addr",
                HOSTS[0],
                "--master-port",
                "29500",
                "/opt/ml/code/bench_job.py",
                *argv,
            ]
            for index, host in enumerate(HOSTS)
        }
        return BenchCluster(
            image=config.base, root=root, hosts=HOSTS, environment=env, code=code,
            command=None, host_commands=commands,
        )  # fmt: skip
    hps = {key: json.dumps(value) for key, value in job.items()}
    hps["sagemaker_program"] = json.dumps("bench_job.py")
    if variant == "incumbent":
        hps["sagemaker_submit_directory"] = json.dumps("/opt/ml/code")
        hps["sagemaker_torch_distributed_enabled"] = "true"
        # the toolkit's processes per host (on CPU it defaults to 1; PET_NPROC_PER_NODE is
        # overridden by the --nproc_per_node it always passes)
        hps["sagemaker_mpi_num_of_processes_per_host"] = str(config.procs)
        image = config.base
    else:
        env["PET_NPROC_PER_NODE"] = str(config.procs)
        if variant == "ours-nopreflight":
            env["CONTAINER_ENTRY_PREFLIGHT"] = "false"
        image = config.image
    return BenchCluster(
        image=image, root=root, hosts=HOSTS, hyperparameters=hps, environment=env, code=code
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

    def events(self) -> list[dict[str, Any]]:
        """The job's `BENCH` lines: kind, host, rank, seq, embedded time, arrival time."""
        with self.lock:
            lines = list(self.lines)
        found = []
        for host, arrival, line in lines:
            match = LINE.search(line)
            if not match:
                continue
            fields = dict(FIELD.findall(match.group(2)))
            found.append(
                {
                    "kind": match.group(1),
                    "host": host,
                    "rank": int(fields["rank"]) if "rank" in fields else None,
                    "seq": int(fields.get("seq", -1)),
                    "world": int(fields.get("world", 0)),
                    "t": float(match.group(3)),
                    "arrival": arrival,
                }
            )
        return found


def _tail(cluster: Cluster) -> str:
    parts = []
    for host, container in getattr(cluster, "containers", []):
        try:
            text = container.logs(tail=25).decode(errors="replace")
        except Exception as error:
            text = f"(no logs: {error})"
        parts.append(f"--- {host}\n{text}")
    return "\n".join(parts)


def _started_at(cluster: Cluster) -> dict[str, float]:
    started = {}
    for host, container in cluster.containers:
        container.reload()
        started[host] = docker_time(container.attrs["State"]["StartedAt"])
    return started


def _json_files(cluster: Cluster, pattern: str) -> list[dict[str, Any]]:
    found = []
    for host in cluster.hosts:
        for path in sorted((cluster.tree(host) / "output" / "data").glob(pattern)):
            found.append(json.loads(path.read_text()))
    return found


def run_job(variant: str, config: Config, root: Path) -> dict[str, Any]:
    """Start, log latency, throughput and `docker stop` in one job: the HF Trainer run, then
    all_reduce ticks until every rank has printed `config.ticks` of them after training, then
    `docker stop` on every host at once."""
    world = config.procs * len(HOSTS)
    job = {
        "train-steps": config.steps,
        "warmup": config.warmup,
        "ticks": 0,
        "tick-seconds": config.tick_seconds,
    }
    cluster = make_cluster(variant, config, job, root)
    result: dict[str, Any] = {"variant": variant, "scenario": "job"}
    try:
        cluster.start()
        tap = LogTap(cluster)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            events = tap.events()
            ticks: dict[int, int] = {}
            for event in events:
                if event["kind"] == "tick":
                    ticks[event["rank"]] = ticks.get(event["rank"], 0) + 1
            if len(ticks) == world and min(ticks.values()) >= config.steps + config.ticks:
                break
            if any(c.status == "exited" for c in _reloaded(cluster)):
                break
            time.sleep(0.2)
        started = _started_at(cluster)
        sent = time.time()
        cluster.stop(timeout=config.stop_timeout)
        results = cluster.wait(timeout=time.monotonic() - cluster.started + 60)
        events = tap.events()
        firsts = [e for e in events if e["kind"] == "first"]
        ready = [e for e in events if e["kind"] == "ready"]
        # arrivals before the tap attached are not latencies: skip each rank's first 3 ticks
        ticks_seen = [e for e in events if e["kind"] == "tick" and e["seq"] >= 3]
        result["world"] = sorted({e["world"] for e in ready})
        result["ranks_ticking"] = len({e["rank"] for e in ticks_seen})
        if len(firsts) >= world:
            result["start_s"] = max(e["t"] - started[e["host"]] for e in firsts)
        latencies = [e["arrival"] - e["t"] for e in ticks_seen]
        if latencies:
            result["log_median_s"] = statistics.median(latencies)
            result["log_max_s"] = max(latencies)
            result["log_lines"] = len(latencies)
        terms = _json_files(cluster, "bench-term-rank-*.json")
        result["ranks_signalled"] = len(terms)
        result["stop_exit"] = [r.exit_code for r in results]
        exited = {r.host: docker_time(r.finished_at) - sent for r in results if r.finished_at}
        result["stop_exited_by_host_s"] = exited
        result["stop_all_exited_s"] = max(exited.values()) if exited else None
        if len(terms) == world:
            result["sigterm_s"] = max(t["t"] for t in terms) - sent
        records = _json_files(cluster, "bench-train.json")
        if records:
            result.update(records[0])
        if result["ranks_ticking"] < world or not records:
            result["error"] = "not every rank trained and ticked\n" + _tail(cluster)
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {error}\n{_tail(cluster)}"
    finally:
        _cleanup(cluster)
    return result


def _cleanup(cluster: Cluster) -> None:
    try:
        cluster.cleanup()
    except Exception as error:  # e.g. the engine restarted under us: nothing left to remove
        print(f"cleanup: {type(error).__name__}: {error}", file=sys.stderr)


def _wait_for_engine(client: Any, seconds: float = 300) -> None:
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


def _reloaded(cluster: Cluster) -> list[Any]:
    for _, container in cluster.containers:
        container.reload()
    return [c for _, c in cluster.containers]


def run_failure(variant: str, config: Config, root: Path) -> dict[str, Any]:
    """The last rank on algo-2 raises; how long until every container has exited."""
    job = {
        "ticks": 0,
        "tick-seconds": config.tick_seconds,
        "fail-host": HOSTS[-1],
        "fail-tick": config.fail_tick,
    }
    cluster = make_cluster(variant, config, job, root)
    result: dict[str, Any] = {"variant": variant, "scenario": "failure"}
    fail_file = cluster.tree(HOSTS[-1]) / "output" / "data" / "bench-fail.json"
    try:
        cluster.start()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not fail_file.exists():
            if all(c.status == "exited" for c in _reloaded(cluster)):
                break
            time.sleep(0.2)
        if not fail_file.exists():
            result["error"] = "the planted failure never ran\n" + _tail(cluster)
            return result
        failed_at = json.loads(fail_file.read_text())["t"]
        # Cluster.wait kills a container that outlives its timeout (status -1)
        results = cluster.wait(timeout=time.monotonic() - cluster.started + config.fail_cap)
        result["exit_codes"] = [r.exit_code for r in results]
        result["world"] = sorted(
            {int(w) for r in results for w in re.findall(r"BENCH ready .*?world=(\d+)", r.logs)}
        )
        if any(r.exit_code == -1 for r in results):
            result["hung"] = True  # still running fail_cap seconds after the failure
        else:
            exited = {r.host: docker_time(r.finished_at) - failed_at for r in results}
            result["failure_exited_by_host_s"] = exited
            result["failure_s"] = max(exited.values())
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {error}\n{_tail(cluster)}"
    finally:
        _cleanup(cluster)
    return result


SCENARIOS: dict[str, Callable[[str, Config, Path], dict[str, Any]]] = {
    "job": run_job,
    "failure": run_failure,
}


# ------------------------------------------------------------------------------------ report
def machine() -> dict[str, str]:
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
    return {
        "cpus": str(os.cpu_count()),
        "cpu": cpu,
        "memory": f"{mem_kb / 1024**2:.1f} GiB",
        "kernel": platform.release(),
        "docker": f"{server.get('Version')} (API {server.get('ApiVersion')})",
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def values(runs: list[dict[str, Any]], variant: str, key: str) -> list[float]:
    return [r[key] for r in runs if r["variant"] == variant and r.get(key) is not None]


def cell(xs: list[float], scale: float = 1.0, digits: int = 2) -> str:
    if not xs:
        return "n/a"
    med = statistics.median(xs) * scale
    if len(xs) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(xs) * scale:.{digits}f}-{max(xs) * scale:.{digits}f})"


def ratio(a: list[float], b: list[float]) -> str:
    if not a or not b or statistics.median(b) == 0:
        return "n/a"
    return f"{statistics.median(a) / statistics.median(b):.2f}x"


def build_table(
    runs: list[dict[str, Any]], sizes: dict[str, int], config: Config, variants: list[str]
) -> list[str]:
    """Markdown rows: a column per variant, ours against the others, the goal and verdict."""
    rows = [
        "| measure | "
        + " | ".join(LABELS[v] for v in variants)
        + " | ours / torchrun | ours / incumbent | goal | met |",
        "|---" * (len(variants) + 5) + "|",
    ]

    def count(variant: str, scenario: str) -> int:
        return sum(1 for r in runs if r["variant"] == variant and r["scenario"] == scenario)

    def latency_row(
        label: str,
        key: str,
        scale: float,
        digits: int,
        goal_text: str,
        goal_ok: Callable[[list[float], list[float]], bool] | None,
        missing: tuple[str, Callable[[str, int], str]],
    ) -> None:
        xs = {v: values(runs, v, key) for v in VARIANTS}
        shown = {}
        for v in variants:
            text = cell(xs[v], scale, digits)
            missing_runs = count(v, missing[0]) - len(xs[v])
            if missing_runs:
                text = (text + "; " if xs[v] else "") + missing[1](v, missing_runs)
            shown[v] = text
        if goal_ok is None:
            verdict = "-"
        else:
            verdict = "yes" if xs["ours"] and goal_ok(xs["ours"], xs["torchrun"]) else "**no**"
        rows.append(
            f"| {label} | {' | '.join(shown[v] for v in variants)} | "
            f"{ratio(xs['ours'], xs['torchrun'])} | {ratio(xs['ours'], xs['incumbent'])} | "
            f"{goal_text} | {verdict} |"
        )

    def never(what: str) -> Callable[[str, int], str]:
        return lambda v, n: f"{what} in {n} run{'s' if n > 1 else ''}"

    def median_within(factor: float) -> Callable[[list[float], list[float]], bool]:
        return lambda o, t: bool(t) and statistics.median(o) <= factor * statistics.median(t)

    def every_run_under(limit: float) -> Callable[[list[float], list[float]], bool]:
        return lambda o, t: max(o) <= limit

    # label, run key, scale, digits, goal, goal check (None: no goal), (scenario, when missing)
    for spec in (
        ("container start → first line of the user's script (s)", "start_s", 1, 2,
         "≤ 1.15x bare torchrun (median)", median_within(1.15), ("job", never("no first line"))),
        ("print → visible on the container's stdout, median line (ms)", "log_median_s", 1000, 0,
         "≤ 1 s (every run)", every_run_under(1.0), ("job", never("no tick lines"))),
        ("print → visible on the container's stdout, slowest line (ms)", "log_max_s", 1000, 0,
         "≤ 1 s (every run)", every_run_under(1.0), ("job", never("no tick lines"))),
        ("one rank fails on host 2 of 2 → every container exited (s)", "failure_s", 1, 1,
         "≤ 15 s (every run)", every_run_under(15),
         ("failure", never(f"still running {config.fail_cap:.0f} s after the failure"))),
        ("`docker stop` → every rank signalled (ms)", "sigterm_s", 1000, 0,
         "≤ 1 s (every run)", every_run_under(1.0),
         ("job", never(f"not every rank signalled (SIGKILL after {config.stop_timeout} s)"))),
        ("`docker stop` → every container exited (s)", "stop_all_exited_s", 1, 1,
         f"none (SIGKILL at {config.stop_timeout} s)", None, ("job", never("no exit time"))),
        ("tiny DDP HF Trainer, steps per second", "steps_per_second", 1, 2,
         "≥ 0.98x bare torchrun (median)",
         lambda o, t: bool(t) and statistics.median(o) >= 0.98 * statistics.median(t),
         ("job", never("failed"))),
    ):  # fmt: skip
        latency_row(*spec)
    added = {v: sizes[v] - sizes["base"] for v in VARIANTS}
    rows.append(
        f"| image bytes added over the base | {' | '.join(f'{added[v]:,}' for v in variants)} | "
        "- | - | ≤ 5 MB | "
        f"{'yes' if added['ours'] <= 5_000_000 else '**no**'} |"
    )
    return rows


def render(
    runs, sizes, config: Config, info: dict[str, str], load: dict[str, Any], command: str
) -> str:
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in runs)]
    rounds = max((r.get("round", 0) for r in runs), default=0) + 1
    world = config.procs * len(HOSTS)
    errors = [r for r in runs if r.get("error")]
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by scripts/benchmark.py: edit the script, not this file. -->",
        "",
        f"Generated by `{command}` on {info['date']}.",
        "",
        f"**Machine**: {info['cpus']} CPUs ({info['cpu']}), {info['memory']} memory, kernel "
        f"{info['kernel']}, docker {info['docker']}. No GPU: the job is CPU DDP on gloo.",
        "",
        f"**Load**: 1-minute load average {load['before']:.2f} before, up to "
        f"{max([r.get('load1', 0) for r in runs] + [load['after']]):.2f} during (the benchmark's "
        f"own two containers on {info['cpus']} CPUs) and {load['after']:.2f} after the runs; "
        f"{load['others']} other container(s) at most running when a measured job started. "
        + (
            "Other load was present: read the ratios, measured side by side, rather than the "
            "absolute figures."
            if load["others"] or load["before"] > 1.0
            else "No other load was seen."
        ),
        "",
        f"**Job**: 2 hosts x {config.procs} process(es) = world size {world}, on the DLC "
        f"stand-in `{config.base}` (bare torchrun and incumbent) and `{config.image}` (ours); "
        f"{rounds} round(s), each running every scenario for each launcher one after the "
        "other (order rotated each round). Cells: median (min-max) over the rounds. "
        "*ours, preflight off* is the same image with `CONTAINER_ENTRY_PREFLIGHT=false` (ours "
        "runs a cluster preflight, a torchrun launch of its own, before the script on multi-host "
        "jobs); it shows that check's share, the goals are judged on *ours* as shipped.",
        "",
        *build_table(runs, sizes, config, variants),
        "",
        "How each figure is taken (all from the host; container and host share one clock):",
        "",
        "Each round runs two jobs per launcher: (1) train, then tick, then `docker stop`; "
        "(2) tick until a rank fails.",
        "",
        "- **start**: `scripts/bench_job.py` prints `BENCH first t=<time.time()>` as its first "
        "statement; per rank, that time minus its container's docker `State.StartedAt`; the "
        "slowest rank counts.",
        f"- **print → stdout**: each rank prints `BENCH tick ... t=<time.time()>` at each "
        f"training step, then every {config.tick_seconds:g} s (after an all_reduce); the "
        "benchmark follows every "
        "container's `docker logs --follow` and subtracts the embedded time from the arrival "
        "time (each rank's first 3 ticks skipped). Median and slowest line of each run; the "
        "docker log pipeline is in all of them.",
        f"- **failure**: the last rank on algo-2 writes the time and raises at tick "
        f"{config.fail_tick}; the figure is the last container's `State.FinishedAt` minus that "
        f"time. A run still going {config.fail_cap:.0f} s after the failure is killed and "
        "counted as never.",
        f"- **docker stop**: after training, once every rank has printed {config.ticks} more "
        f"ticks, `docker stop -t {config.stop_timeout}` on both containers at once; each "
        "rank's SIGTERM handler writes the time; the figure is the last rank's time minus the "
        "time the stop was sent. The containers' `State.FinishedAt` gives the exit row.",
        f"- **throughput**: in the same job, first a BERT-like model (hidden 64, 2 layers, "
        f"seq 32, batch 16 per rank) under the HF Trainer, {config.steps} steps, one tick line "
        f"per step; steps/s of rank 0 from step {config.warmup} to the end (start-up "
        "excluded).",
        "- **image bytes**: `docker image inspect` size of the image minus that of the base "
        "(bare torchrun and the incumbent run in the base itself).",
        "",
        "Same environment for all: `ACCELERATE_USE_CPU=true` (what the HF Trainer needs "
        "to run DDP on gloo on a GPU-less host; ours sets it itself, the others do not) and "
        "`OMP_NUM_THREADS=1` (so thread policy does not differ between launchers).",
        "",
        "What the incumbent needed to run here: hyperparameters `sagemaker_program`, "
        '`sagemaker_submit_directory` ("/opt/ml/code"), `sagemaker_torch_distributed_enabled` '
        '("true") and, for more than 1 process per host on CPU, '
        "`sagemaker_mpi_num_of_processes_per_host` (it counts GPUs with `nvidia-smi`, "
        "finds none and starts 1 process per host; `PET_NPROC_PER_NODE` is not honoured "
        "because it always passes `--nproc_per_node`). No gethostname shim was needed: its "
        "torchrun gets `--master_addr` and `--node_rank` from the resourceconfig host list, "
        "which the containers resolve through their docker network aliases. It takes the "
        "master and node ranks from the instance group's host list, which SageMaker does not "
        "sort, so algo-2 was its master (node rank 0) here. As PID 1 it installs no SIGTERM "
        "handler, so `docker stop` never reaches the ranks and ends in SIGKILL (the real "
        "DLC's `bash -m` PID 1 does not forward it either).",
        "",
    ]
    if errors:
        lines += ["Runs that failed (full logs in build/benchmark.json):", ""]
        lines += [
            f"- round {r.get('round')}: {r['variant']} {r['scenario']}: "
            f"{r['error'].splitlines()[0]}"
            for r in errors
        ]
        lines.append("")
    return "\n".join(lines)


GPU_PLACEHOLDER = f"""{GPU_BEGIN}
## GPU: DataParallel (the incumbent's default) against our DDP launch

Not run yet: this machine has no GPU. `scripts/gpu_benchmark.py` trains the same HF model
(GPT-2 small from its config) under `nn.DataParallel` (what the HF Trainer falls back to when
the DLC runs the script once per host) and under our launch (`container-entry train`: one DDP
process per GPU), in alternation, and prints per-GPU peak memory (max/min) and samples per
second. On a host with GPUs (1 works; 2 or more show the imbalance), in our image:

```bash
make build BASE_IMAGE=<HF PyTorch training DLC> IMAGE=container-entry:bench
docker run --gpus all --rm --shm-size 8g -v "$PWD":/w -w /w container-entry:bench \\
    python scripts/gpu_benchmark.py --write-docs docs/benchmarks.md
```

Its results replace this section (`make bench` keeps them).
{GPU_END}"""


def gpu_section() -> str:
    """The GPU results block already in the docs page (written by gpu_benchmark.py)."""
    if DOCS.exists():
        text = DOCS.read_text()
        start, end = text.find(GPU_BEGIN), text.find(GPU_END)
        if start >= 0 and end > start:
            return text[start : end + len(GPU_END)]
    return GPU_PLACEHOLDER


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="container-entry:bench", help="our image")
    parser.add_argument("--base", default="container-entry/dlc-standin:latest")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round, shorter jobs")
    parser.add_argument("--procs-per-host", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="a subset, for trials")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="a subset, for trials")
    parser.add_argument("--out", type=Path, default=DOCS, help="markdown page to (re)write")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--json", type=Path, default=REPO / "build" / "benchmark.json")
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="rewrite the page from saved results only"
    )
    args = parser.parse_args()
    if args.render:
        saved = json.loads(args.render.read_text())
        page = render(
            saved["runs"],
            saved["sizes"],
            Config(**saved["config"]),
            saved["machine"],
            saved["load"],
            saved["command"],
        )
        return _publish(page + "\n" + gpu_section() + "\n", args)
    quick = args.quick
    config = Config(
        image=args.image,
        base=args.base,
        procs=args.procs_per_host,
        ticks=8 if quick else 12,
        tick_seconds=0.25,
        fail_tick=6,
        steps=40 if quick else 120,
        warmup=10 if quick else 20,
        stop_timeout=10,
        fail_cap=60.0,
    )
    rounds = 1 if quick else args.rounds
    variants = [v for v in args.variants.split(",") if v]
    scenarios = [s for s in args.scenarios.split(",") if s]
    client = docker.from_env()
    sizes = {"base": client.images.get(args.base).attrs["Size"]}
    sizes.update(
        torchrun=sizes["base"],
        incumbent=sizes["base"],
        ours=client.images.get(args.image).attrs["Size"],
    )
    sizes["ours-nopreflight"] = sizes["ours"]
    info = machine()
    load = {"before": os.getloadavg()[0], "others": 0}
    runs: list[dict[str, Any]] = []
    began = time.monotonic()
    for round_ in range(rounds):
        for scenario in scenarios:
            order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
            for variant in order:
                _wait_for_engine(client)
                others = len(client.containers.list())
                load["others"] = max(load["others"], others)
                root = Path(tempfile.mkdtemp(prefix="ce-bench-"))
                try:
                    result = SCENARIOS[scenario](variant, config, root)
                except Exception as error:  # the engine went away mid-run
                    result = {"variant": variant, "scenario": scenario, "error": repr(error)}
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                result["round"] = round_
                result["others_at_start"] = others
                result["load1"] = os.getloadavg()[0]
                runs.append(result)
                shown = {k: v for k, v in result.items() if k != "error"}
                print(f"[{time.monotonic() - began:6.0f} s] {json.dumps(shown)}", flush=True)
                if result.get("error"):
                    print(result["error"][-3000:], file=sys.stderr, flush=True)
    load["after"] = os.getloadavg()[0]
    command = "python scripts/benchmark.py " + " ".join(sys.argv[1:])
    if os.environ.get("MAKELEVEL"):
        command = "make bench" + (f" ARGS='{os.environ['ARGS']}'" if os.environ.get("ARGS") else "")
    page = render(runs, sizes, config, info, load, command) + "\n" + gpu_section() + "\n"
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "command": command,
                "config": dataclasses.asdict(config),
                "sizes": sizes,
                "machine": info,
                "load": load,
                "runs": runs,
            },
            indent=1,
        )
    )
    print(f"total {time.monotonic() - began:.0f} s")
    return _publish(page, args)


def _publish(page: str, args: argparse.Namespace) -> int:
    print()
    print(page)
    if not args.no_write:
        args.out.write_text(page)
        print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
