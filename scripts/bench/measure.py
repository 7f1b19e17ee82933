"""The two jobs each variant runs per round, and the figures taken from each.

job:      the HF Trainer run (throughput), then all_reduce ticks (print -> stdout latency)
          until every rank has printed `config.ticks` of them after training, then
          `docker stop` on every host at once (signal and exit times); its start gives the
          start figure.
failure:  ticks until the last rank on the last host raises; how long until every container
          has exited.
end:      ticks, then the script ends by itself; its last statement -> every container exited.
docs/benchmarks.md says how each figure is taken.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from scripts.bench import observe
from scripts.bench.launchers import make_cluster
from scripts.bench.observe import Event, LogTap
from scripts.bench.results import HOSTS, Config, Run
from scripts.local.cluster import Cluster, HostResult

SKIPPED_TICKS = 3  # arrivals before the tap attached are not latencies


def start_seconds(firsts: list[Event], started: dict[str, float]) -> float:
    """Container start -> the script's first line, the slowest rank's."""
    return max(e.t - started[e.host] for e in firsts)


def first_step_seconds(ticks: list[Event], started: dict[str, float]) -> float | None:
    """Container start -> the first training step done, the slowest rank's: the start with
    the script's own imports (`import torch`, which the preflight in the script's Python has
    already paid), which the first line alone does not show."""
    firsts = {}
    for e in ticks:
        if e.seq == 0 and e.rank is not None:
            firsts[e.rank] = e.t - started[e.host]
    return max(firsts.values()) if firsts else None


def log_latencies(ticks: list[Event]) -> list[float]:
    """Print -> arrival on the container's stdout, per tick line."""
    return [e.arrival - e.t for e in ticks if e.seq >= SKIPPED_TICKS]


def exit_seconds(results: list[HostResult], since: float) -> dict[str, float]:
    """Each host's container's State.FinishedAt after `since`."""
    return {r.host: observe.docker_time(r.finished_at) - since for r in results if r.finished_at}


def _trained_and_ticked(events: list[Event], config: Config) -> bool:
    ticks = Counter(e.rank for e in events if e.kind == "tick")
    return len(ticks) == config.world and min(ticks.values()) >= config.steps + config.ticks


def _take_job_figures(run: Run, cluster: Cluster, tap: LogTap, config: Config) -> None:
    started = observe.started_at(cluster)
    sent = time.time()
    cluster.stop(timeout=config.stop_timeout)
    results = cluster.wait(timeout=time.monotonic() - cluster.started + 60)
    events = tap.events()
    firsts = [e for e in events if e.kind == "first"]
    ticks = [e for e in events if e.kind == "tick"]
    run.world = sorted({e.world for e in events if e.kind == "ready"})
    run.ranks_ticking = len({e.rank for e in ticks if e.seq >= SKIPPED_TICKS})
    if len(firsts) >= config.world:
        run.start_s = start_seconds(firsts, started)
    run.preflight_s = max(tap.preflight_seconds(), default=None)
    run.first_step_s = first_step_seconds(ticks, started)
    latencies = log_latencies(ticks)
    if latencies:
        run.log_median_s = statistics.median(latencies)
        run.log_max_s = max(latencies)
        run.log_lines = len(latencies)
    terms = observe.json_files(cluster, "bench-term-rank-*.json")
    run.ranks_signalled = len(terms)
    if len(terms) == config.world:
        run.sigterm_s = max(t["t"] for t in terms) - sent
    run.stop_exit = [r.exit_code for r in results]
    run.stop_exited_by_host_s = exit_seconds(results, sent)
    run.stop_all_exited_s = max(run.stop_exited_by_host_s.values(), default=None)
    records = observe.json_files(cluster, "bench-train.json")
    if records:
        train = records[0]
        run.steps_per_second = train["steps_per_second"]
        run.steps = train.get("steps")
        run.world_size = train.get("world_size")
        run.parallel_mode = train.get("parallel_mode")
    if run.ranks_ticking < config.world or not records:
        run.error = "not every rank trained and ticked\n" + observe.tail(cluster)


def run_job(variant: str, config: Config, root: Path) -> Run:
    """Start, log latency, throughput and `docker stop`, in one job."""
    job = {
        "train-steps": config.steps,
        "warmup": config.warmup,
        "ticks": 0,
        "tick-seconds": config.tick_seconds,
    }
    cluster = make_cluster(variant, config, job, root)
    run = Run(variant=variant, scenario="job")
    try:
        cluster.start()
        tap = LogTap(cluster)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if _trained_and_ticked(tap.events(), config) or observe.any_exited(cluster):
                break
            time.sleep(0.2)
        _take_job_figures(run, cluster, tap, config)
    except Exception as error:
        run.error = f"{type(error).__name__}: {error}\n{observe.tail(cluster)}"
    finally:
        observe.cleanup(cluster)
    return run


def _take_failure_figures(run: Run, cluster: Cluster, failed_at: float, config: Config) -> None:
    # Cluster.wait kills a container that outlives its timeout (status -1)
    results = cluster.wait(timeout=time.monotonic() - cluster.started + config.fail_cap)
    run.exit_codes = [r.exit_code for r in results]
    run.world = sorted(
        {int(w) for r in results for w in re.findall(r"BENCH ready .*?world=(\d+)", r.logs)}
    )
    if any(r.exit_code == -1 for r in results):
        run.hung = True  # still running fail_cap seconds after the failure
    else:
        run.failure_exited_by_host_s = exit_seconds(results, failed_at)
        run.failure_s = max(run.failure_exited_by_host_s.values())


def run_failure(variant: str, config: Config, root: Path) -> Run:
    """The last rank on the last host raises; how long until every container has exited."""
    job = {
        "ticks": 0,
        "tick-seconds": config.tick_seconds,
        "fail-host": HOSTS[-1],
        "fail-tick": config.fail_tick,
    }
    cluster = make_cluster(variant, config, job, root)
    run = Run(variant=variant, scenario="failure")
    fail_file = cluster.tree(HOSTS[-1]) / "output" / "data" / "bench-fail.json"
    try:
        cluster.start()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not fail_file.exists():
            if observe.all_exited(cluster):
                break
            time.sleep(0.2)
        if fail_file.exists():
            failed_at = json.loads(fail_file.read_text())["t"]
            _take_failure_figures(run, cluster, failed_at, config)
        else:
            run.error = "the planted failure never ran\n" + observe.tail(cluster)
    except Exception as error:
        run.error = f"{type(error).__name__}: {error}\n{observe.tail(cluster)}"
    finally:
        observe.cleanup(cluster)
    return run


def run_end(variant: str, config: Config, root: Path) -> Run:
    """The script ends by itself: its last statement on the last rank -> every container
    exited (the end of a job should be as prompt as a failure)."""
    job = {"ticks": config.ticks, "tick-seconds": config.tick_seconds}
    cluster = make_cluster(variant, config, job, root)
    run = Run(variant=variant, scenario="end")
    try:
        cluster.start()
        results = cluster.wait(timeout=240)
        run.end_exit = [r.exit_code for r in results]
        ends = observe.json_files(cluster, "bench-end-rank-*.json")
        if len(ends) == config.world and all(code == 0 for code in run.end_exit):
            run.end_s = max(exit_seconds(results, max(e["t"] for e in ends)).values())
            if variant.startswith("ours"):
                _take_end_parts(run, cluster, results, ends)
        else:
            run.error = f"the job did not end cleanly: {run.end_exit}\n" + observe.tail(cluster)
    except Exception as error:
        run.error = f"{type(error).__name__}: {error}\n{observe.tail(cluster)}"
    finally:
        observe.cleanup(cluster)
    return run


FINISHED = "[container-entry] training finished"


def _take_end_parts(
    run: Run, cluster: Cluster, results: list[HostResult], ends: list[dict]
) -> None:
    """Where the end of a job goes, slowest host per part: the script's own exit (Python's
    teardown, the process group's), then torchrun noticing and leaving (its exit barrier) and
    the bootstrap's verdict, then the side channel's end (the master waits for every host)."""
    last = {e["rank"]: e["t"] for e in ends}
    exited, verdicts, finished = [], [], []
    for result, (_, container) in zip(results, cluster.containers, strict=True):
        records = sorted(
            (cluster.tree(result.host) / "output/data/container-entry").glob("rank-*.json")
        )
        ended = {r["rank"]: r["ended_at"] for r in map(json.loads, map(Path.read_text, records))}
        exited += [ended[rank] - last[rank] for rank in ended if rank in last]
        lines = container.logs(timestamps=True).decode(errors="replace").splitlines()
        said = [observe.docker_time(x.split(" ", 1)[0]) for x in lines if FINISHED in x]
        if ended and said and result.finished_at:
            verdicts.append(said[-1] - max(ended.values()))
            finished.append(observe.docker_time(result.finished_at) - said[-1])
    if exited and verdicts:
        run.end_rank_exit_s, run.end_verdict_s = max(exited), max(verdicts)
        run.end_finish_s = max(finished)


SCENARIOS: dict[str, Callable[[str, Config, Path], Run]] = {
    "job": run_job,
    "failure": run_failure,
    "end": run_end,
}
