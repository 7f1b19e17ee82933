"""The GPU check's scenarios (scripts/gpu/check.py): each runs the bootstrap on a tree of its
own and returns a verdict with the figures it saw. A verdict is ok only when every expectation
held; otherwise FAIL names the first one that did not."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from scripts.gpu.fr_fields import check_fr_fields
from scripts.gpu.jobs import (
    HF_EXAMPLE,
    PROBE,
    REPO,
    Context,
    Failed,
    Job,
    Result,
    Skipped,
    alive,
    expect,
    failure_line,
    job_env,
    kill_all,
    make_tree,
    probe_facts,
    run_dir,
    short,
    start_job,
)

JOB_TIMEOUT = 300.0  # seconds for a probe job: start-up (torch, NCCL) and teardown included
START_TIMEOUT = 180.0  # for every rank's first PROBE line
HF_TIMEOUT = 600.0
BENCH_TIMEOUT = 900.0
# on "cpu" (gloo, the suite's self-test on a 2-CPU machine beside busy jobs) a rank's import of
# torch and its start alone took 11 s, and a process may wait seconds for a CPU: wider there
HANG_TIMEOUT = {"cuda": 15, "cpu": 20}
# seconds a rank may take past its checkpoint, and the bootstrap past the ranks
STOP_SLACK = {"cuda": 2.0, "cpu": 10.0}


def probe_job(ctx: Context, name: str, mode: str, **env: str) -> tuple[Path, Job]:
    hps = {"mode": mode, "device": ctx.device, "checkpoint-seconds": f"{ctx.checkpoint_seconds:g}"}
    base = make_tree(ctx, name, PROBE, hps)
    return base, start_job(ctx, base, PROBE.name, **env)


def finished(job: Job, timeout: float) -> int:
    """The job's exit code; one still running after `timeout` is killed and fails the scenario."""
    code = job.run(timeout)
    if code is None:
        raise Failed(f"timed out after {timeout:g} s, processes killed; {job.log}")
    return code


def check_plan(ctx: Context) -> str:
    base = make_tree(ctx, "plan", PROBE, {"mode": "ok", "device": ctx.device})
    done = subprocess.run(
        [ctx.python, "-m", "container_entry", "plan"],
        env=job_env(ctx, base, PROBE.name),
        cwd=base.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    (base.parent / "out.txt").write_text(done.stdout + done.stderr)
    expect(done.returncode == 0, f"exit {done.returncode}: {short(done.stderr.strip())}")
    try:
        plan = json.loads(done.stdout)
    except ValueError as error:
        raise Failed(f"the plan is not JSON: {error}") from None
    nproc, backend = str(plan.get("nproc_per_node")), plan.get("backend")
    expect(nproc == str(ctx.world), f"nproc_per_node {nproc}, expected {ctx.world}")
    expect(backend == ctx.backend, f"backend {backend}, expected {ctx.backend}")
    problems = plan.get("problems") or []
    expect(not problems, f"plan problems: {short('; '.join(map(str, problems)))}")
    return f"exit 0; nproc_per_node {nproc} ({plan.get('nproc_source')}), backend {backend}"


def check_ddp(ctx: Context) -> str:
    base, job = probe_job(ctx, "ddp", "ok", CONTAINER_ENTRY_PREFLIGHT="true")
    code = finished(job, JOB_TIMEOUT)
    expect(code == 0, f"exit {code}: {short(failure_line(base))}")
    preflight = next((line for line in job.lines if "preflight ok on algo-1" in line), None)
    expect(preflight, "no 'preflight ok on algo-1' line")
    ranks = probe_facts(job.lines)
    expect(len(ranks) == ctx.world, f"PROBE lines from {len(ranks)} rank(s), expected {ctx.world}")
    sums = {r["all_reduce"] for r in ranks.values()}
    expect(sums == {float(ctx.world)}, f"all_reduce gave {sorted(sums)}, expected {ctx.world}")
    rank0 = ranks[min(ranks)]
    bandwidth = re.search(r"bus bandwidth [\d.]+ \S+", preflight or "")
    took = re.search(r"; in ([\d.]+ s)", preflight or "")
    seen = [f"in {took.group(1)}"] if took else []
    seen += [bandwidth.group(0)] if bandwidth else []
    return (
        f"exit 0; preflight ok {', '.join(seen)}; all_reduce {ctx.world} on {len(ranks)} rank(s), "
        f"{rank0['backend']}, {rank0['device']}"
    )


def transformers_missing(python: str) -> str | None:
    """Why the HF scenario cannot run here, or None."""
    done = subprocess.run(
        [python, "-c", "import transformers, accelerate"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    return (lines[-1] if lines else f"exit {done.returncode}") if done.returncode else None


def check_hf(ctx: Context) -> str:
    missing = transformers_missing(ctx.python)
    if missing:
        raise Skipped(f"transformers not importable: {short(missing, 80)}")
    base = make_tree(ctx, "hf", HF_EXAMPLE, {})
    job = start_job(ctx, base, HF_EXAMPLE.name)
    code = finished(job, HF_TIMEOUT)
    expect(code == 0, f"exit {code}: {short(failure_line(base))}")
    losses = [line for line in job.lines if "'loss'" in line]
    return f"exit 0; {len(losses)} loss line(s) from the Trainer"


# torch, at the exit of a Python whose process group was never destroyed, sometimes aborts
# (seen on CPU with torch 2.15, run 27: Python ends gloo's worker threads mid-C++ at
# finalization). The ranks' exit teardown (GROUP_TEARDOWN_TIMEOUT) destroys the groups first;
# a teardown that runs over its timeout leaves the exit to torch as before.
EXIT_ABORT = "terminate called without an active exception"


def aborted_at_exit(base: Path, wanted: str) -> bool:
    """A rank printed the planted failure's traceback, then torch aborted its exit: exit 134 is
    then the rank's own, and faithfully the job's."""
    for log in (run_dir(base) / "logs").glob("rank-*.log"):
        text = log.read_text(errors="replace")
        if wanted in text and EXIT_ABORT in text[text.rindex(wanted) :]:
            return True
    return False


def check_failure(ctx: Context, mode: str, wanted: str) -> str:
    base, job = probe_job(ctx, mode, mode)
    code = finished(job, JOB_TIMEOUT)
    first = failure_line(base)
    if code == 128 + 6 and aborted_at_exit(base, wanted):
        expect(wanted in first, f"failure's first line lacks {wanted!r}: {short(first)}")
        return f"exit 134 (torch aborted its exit after the exception): {short(first, 100)}"
    expect(code == 1, f"exit {code}, expected 1; failure: {short(first)}")
    expect(wanted in first, f"failure's first line lacks {wanted!r}: {short(first)}")
    why = re.sub(r"\s*\[first failure[^]]*\]$", "", re.sub(r"^.*?exit code \d+: ", "", first))
    return f"exit 1; failure: {short(why, 120)}"


def check_crash(ctx: Context) -> str:
    return check_failure(ctx, "crash", "ValueError: planted failure")


def check_oom(ctx: Context) -> str:
    return check_failure(ctx, "oom", "(hint: GPU out of memory")


def check_hang(ctx: Context) -> str:
    timeout = HANG_TIMEOUT[ctx.device]
    base, job = probe_job(ctx, "hang", "hang", CONTAINER_ENTRY_HANG_TIMEOUT=str(timeout))
    code = finished(job, timeout + 120)
    first = failure_line(base)
    expect(code == 124, f"exit {code}, expected 124; failure: {short(first)}")
    expect(first.startswith("hung:"), f"failure's first line: {short(first)}")
    dump = run_dir(base) / "flight-recorder" / "rank-0.json"
    expect(dump.is_file(), f"no flight-recorder dump {dump}")
    try:
        recorders = json.loads(dump.read_text()).get("recorders")
    except (ValueError, AttributeError) as error:
        raise Failed(f"{dump} is not a JSON object: {error}") from None
    expect(isinstance(recorders, dict) and recorders, f"{dump}: no recorders")
    counts = {
        name: len(value.get("entries") or [])
        for name, value in recorders.items()
        if isinstance(value, dict)
    }
    expect(any(counts.values()), f"{dump}: no entries in any recorder ({sorted(recorders)})")
    found = ", ".join(f"{name} {count}" for name, count in sorted(counts.items()))
    return f"exit 124; {short(first, 60)}; flight recorder rank 0 entries: {found}"


def stop_figures(ctx: Context, base: Path, job: Job, sigterm_at: float) -> list[str]:
    """Check the stop's records against the SIGTERM's time; the figures measured."""
    records = {}
    for rank in range(ctx.world):
        path = run_dir(base) / f"rank-{rank}.json"
        try:
            records[rank] = json.loads(path.read_text())
        except (OSError, ValueError):
            raise Failed(f"no {path.name}: rank {rank} never ended by itself") from None
    ended = {rank: record.get("ended_at") for rank, record in records.items()}
    expect(all(isinstance(t, float | int) for t in ended.values()), f"no ended_at: {ended}")
    slack = STOP_SLACK[ctx.device]
    limit = ctx.checkpoint_seconds + slack
    last = max(t - sigterm_at for t in ended.values())
    expect(last <= limit, f"a rank ended {last:.1f} s after SIGTERM (limit {limit:g} s)")
    gone = (job.exited_at or time.time()) - (sigterm_at + last)
    expect(gone <= slack, f"the bootstrap exited {gone:.1f} s after the last rank")
    checkpoints = [base / "checkpoints" / f"ckpt-rank{r}.pt" for r in range(ctx.world)]
    missing = [path.name for path in checkpoints if not path.exists()]
    expect(not missing, f"missing checkpoint(s): {missing}")
    figures = [f"last rank {last:.1f} s after SIGTERM", f"bootstrap gone {gone:.1f} s later"]
    terms = [base / "output" / "data" / f"term-rank-{r}.txt" for r in range(ctx.world)]
    if all(p.exists() for p in terms):
        reached = max(float(p.read_text()) for p in terms) - sigterm_at
        figures.insert(0, f"SIGTERM at every rank in {reached:.2f} s")
    return figures


def check_stop(ctx: Context) -> str:
    base, job = probe_job(ctx, "stop", "stop")
    ready = job.wait_for(lambda lines: len(probe_facts(lines)) >= ctx.world, START_TIMEOUT)
    if not ready:
        job.kill()
        raise Failed(f"not every rank printed its PROBE line within {START_TIMEOUT:g} s")
    pids = [facts["pid"] for facts in probe_facts(job.lines).values()]
    sigterm_at = time.time()
    os.kill(job.process.pid, signal.SIGTERM)
    timeout = ctx.checkpoint_seconds + 60
    code = job.wait(timeout)
    if code is None:
        job.kill()
        raise Failed(f"still running {timeout:g} s after SIGTERM, processes killed")
    time.sleep(0.3)  # a rank's last exit to be reaped
    left = sorted(set(job.leftovers()) | {pid for pid in pids if alive(pid)})
    kill_all(left)
    after = f"exit {code} {(job.exited_at or time.time()) - sigterm_at:.1f} s after SIGTERM"
    expect(code == 143, f"{after}, expected 143; failure: {short(failure_line(base), 80)}")
    try:
        figures = stop_figures(ctx, base, job, sigterm_at)
    except Failed as failed:
        raise Failed(f"{failed}; {after}; failure: {short(failure_line(base), 80)}") from None
    expect(not left, f"left running after the bootstrap exited: pids {left}")
    return f"exit 143; {'; '.join(figures)}; {ctx.world} checkpoint(s); nothing left"


def shim_dir(ctx: Context) -> Path | None:
    """A `container-entry` command on PATH (the benchmark launches ours through it), unless one
    is there already."""
    if shutil.which("container-entry", path=ctx.env.get("PATH")):
        return None
    folder = ctx.work / "bench" / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "container-entry"
    shim.write_text(f'#!/bin/sh\nexec "{ctx.python}" -m container_entry "$@"\n')
    shim.chmod(0o755)
    return folder


def check_bench(ctx: Context) -> str:
    script = REPO / "scripts" / "gpu" / "benchmark.py"
    if ctx.device != "cuda":
        raise Skipped("no GPU")
    if not script.is_file():
        raise Skipped(f"{script.relative_to(REPO)} is not in this checkout")
    folder = ctx.work / "bench"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    env = dict(ctx.env)
    shims = shim_dir(ctx)
    if shims:
        env["PATH"] = os.pathsep.join(p for p in (str(shims), env.get("PATH")) if p)
    args = ["--size", "small", "--steps", "60", "--warmup", "10", "--rounds", "2"]
    argv = [ctx.python, str(script), *args, "--json", str(folder / "gpu-bench.json")]
    job = Job.start(argv, env, folder / "out.txt", folder)
    code = finished(job, BENCH_TIMEOUT)
    expect(code == 0, f"exit {code}; {job.log}")
    ratio = next((line for line in job.lines if line.startswith("DDP / DataParallel")), None)
    expect(ratio, "no 'DDP / DataParallel samples/s' line")
    return str(ratio).rstrip(".")


SCENARIOS: dict[str, Callable[[Context], str]] = {
    "plan": check_plan,
    "ddp": check_ddp,
    "hf": check_hf,
    "crash": check_crash,
    "oom": check_oom,
    "hang": check_hang,
    "stop": check_stop,
    "fr-fields": check_fr_fields,
    "bench": check_bench,
}


def run_scenario(ctx: Context, name: str) -> Result:
    """One scenario's verdict; an error of the check itself is a FAIL naming it, not a crash."""
    started = time.monotonic()
    try:
        detail, verdict = SCENARIOS[name](ctx), "ok"
    except Failed as failed:
        detail, verdict = str(failed), "FAIL"
    except Skipped as skipped:
        detail, verdict = str(skipped), "skipped"
    except Exception as error:  # the check's own error: this scenario fails, the rest run
        detail, verdict = f"error of the check: {type(error).__name__}: {error}", "FAIL"
    return Result(name, verdict, detail, time.monotonic() - started)
