"""GPU checks anyone can repeat: the bootstrap from this checkout, on this host, without docker.

    python3 -m scripts.gpu.check [--device auto|cuda|cpu] [--only plan,ddp,...] [--markdown FILE]

Run from the repository root on a GPU host with torch, NCCL and (for `hf`, `bench`)
transformers installed; no docker, no package index. Each scenario runs the bootstrap
(`python -m container_entry train`) as a one-host SageMaker job on a tree of its own under
`--work` and prints one line: its name, ok / FAIL / skipped, its time and what it saw. The exit
code is 0 only when every scenario that ran is ok. `--device cpu` runs the same scenarios on
gloo (the self-test on machines without a GPU, tests/integration/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts.gpu.jobs import REPO, Context, Result, base_env, first_interface
from scripts.gpu.scenarios import SCENARIOS, run_scenario

# train on algo-1, which must resolve (fr-fields runs one rank of its own on 127.0.0.1)
NEEDS_HOSTS = frozenset(SCENARIOS) - {"plan", "bench", "fr-fields"}
HOSTS_LINE = "127.0.0.1 algo-1\n"
FACTS = """
import json, torch
facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": None}
try:
    facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception:
    pass
try:
    import transformers
    facts["transformers"] = transformers.__version__
except Exception:
    facts["transformers"] = None
print(json.dumps(facts))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--only", default="", help=f"comma-separated, of: {','.join(SCENARIOS)}")
    parser.add_argument("--checkpoint-seconds", type=float, default=40.0, help="stop scenario")
    parser.add_argument("--markdown", type=Path, help="write the result table here")
    parser.add_argument("--work", type=Path, help="trees and logs (default: a new temp dir)")
    parser.add_argument(
        "--add-hosts-entry",
        action="store_true",
        help=f"append {HOSTS_LINE.strip()!r} to /etc/hosts",
    )
    return parser.parse_args(argv)


def selected(only: str) -> list[str]:
    return [n.strip() for n in only.split(",") if n.strip()] or list(SCENARIOS)


def nvidia_smi(*args: str) -> list[str]:
    """nvidia-smi's lines, [] without the command or when it fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode:
        return []
    return [line for line in done.stdout.splitlines() if line.strip()]


def gpu_count() -> int:
    return sum(1 for line in nvidia_smi("-L") if line.startswith("GPU "))


def python_facts(python: str) -> dict[str, str | None]:
    """torch, CUDA, NCCL and transformers versions as the job's Python sees them."""
    done = subprocess.run(
        [python, "-c", FACTS], capture_output=True, text=True, timeout=300, check=False
    )
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = done.stderr.strip().splitlines()
        return {"torch": None, "error": tail[-1] if tail else f"exit {done.returncode}"}


def gpu_summary() -> str:
    rows = nvidia_smi("--query-gpu=name,driver_version", "--format=csv,noheader")
    if not rows:
        return "no GPU"
    names = sorted({row.rsplit(",", 1)[0].strip() for row in rows})
    driver = rows[0].rsplit(",", 1)[-1].strip()
    return f"{len(rows)} x {', '.join(names)}, driver {driver}"


def package_path(python: str) -> str | None:
    """The checkout for PYTHONPATH when container_entry is not installed: torchrun starts the
    workers in the code folder, where only an installed package or PYTHONPATH finds it."""
    done = subprocess.run(
        [python, "-c", "import container_entry"], cwd="/", capture_output=True, check=False
    )
    return None if done.returncode == 0 else str(REPO)


def missing_dependency(python: str, pythonpath: str | None) -> str | None:
    """What the bootstrap cannot import from this Python, in one line, or None."""
    env = base_env("cpu", pythonpath)
    probe = "import container_entry, sagemaker_training.mapping, sagemaker_training.params"
    done = subprocess.run(
        [python, "-c", probe], cwd="/", env=env, capture_output=True, text=True, check=False
    )
    if done.returncode == 0:
        return None
    tail = done.stderr.strip().splitlines()
    return tail[-1] if tail else f"exit {done.returncode}"


def ensure_algo_1(add_entry: bool) -> str | None:
    """None when algo-1 resolves (after appending it to /etc/hosts when asked), else why not."""
    try:
        socket.gethostbyname("algo-1")
        return None
    except OSError:
        pass
    if not add_entry:
        return (
            "algo-1 does not resolve: add '127.0.0.1 algo-1' to /etc/hosts "
            "or pass --add-hosts-entry (root)"
        )
    if os.geteuid() != 0:
        return "--add-hosts-entry needs root: algo-1 does not resolve"
    with open("/etc/hosts", "a") as hosts:
        hosts.write(HOSTS_LINE)
    try:
        socket.gethostbyname("algo-1")
    except OSError as error:
        return f"algo-1 still does not resolve after appending it to /etc/hosts: {error}"
    print("gpu-check: appended '127.0.0.1 algo-1' to /etc/hosts", flush=True)
    return None


def line(result: Result) -> str:
    return f"{result.name:<7} {result.verdict:<7} {result.seconds:5.1f} s  {result.detail}"


def markdown(results: list[Result], facts: dict, gpus: str, device: str) -> str:
    """The result table for docs/gpu.md: when, on what, with which versions."""
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    versions = ", ".join(
        f"{name} {facts.get(key) or 'n/a'}"
        for name, key in (("torch", "torch"), ("CUDA", "cuda"), ("NCCL", "nccl"))
    )
    lines = [
        f"GPU checks (`python3 -m scripts.gpu.check`), {date}; device `{device}`; {gpus};",
        f"{versions}; transformers {facts.get('transformers') or 'not installed'}.",
        "",
        "| scenario | verdict | time (s) | what was seen |",
        "|---|---|---|---|",
    ]
    for result in results:
        detail = result.detail.replace("|", "\\|")
        lines.append(f"| {result.name} | {result.verdict} | {result.seconds:.1f} | {detail} |")
    return "\n".join(lines) + "\n"


def make_context(args: argparse.Namespace, gpus: int, pythonpath: str | None) -> Context:
    device = args.device if args.device != "auto" else ("cuda" if gpus else "cpu")
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    return Context(
        device=device,
        gpus=gpus if device == "cuda" else 0,
        work=work.resolve(),
        python=sys.executable,
        checkpoint_seconds=args.checkpoint_seconds,
        interface=first_interface(),
        env=base_env(device, pythonpath),
    )


def preconditions(ctx: Context, names: list[str], add_entry: bool, pythonpath: str | None) -> str:
    """Why nothing can run ("" when all is well)."""
    if ctx.device == "cuda" and not ctx.gpus:
        return "--device cuda, but `nvidia-smi -L` lists no GPU"
    missing = missing_dependency(ctx.python, pythonpath)
    if missing:
        return (
            f"the bootstrap cannot be imported by {ctx.python}: {missing} (sagemaker-training: "
            "`pip install --no-deps` its sdist or wheel copied here, or its src/ on PYTHONPATH)"
        )
    if NEEDS_HOSTS & set(names):
        return ensure_algo_1(add_entry) or ""
    return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = selected(args.only)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"gpu-check: unknown scenario(s) {unknown}; known: {','.join(SCENARIOS)}")
        return 2
    pythonpath = package_path(sys.executable)
    ctx = make_context(args, gpu_count() if args.device != "cpu" else 0, pythonpath)
    problem = preconditions(ctx, names, args.add_hosts_entry, pythonpath)
    if problem:
        print(f"gpu-check: {problem}", flush=True)
        if args.work is None:
            ctx.work.rmdir()  # the empty temp dir made for this run
        return 2
    facts = python_facts(ctx.python)
    gpus = gpu_summary() if ctx.device == "cuda" else "no GPU (gloo)"
    print(
        f"gpu-check: device {ctx.device}, {gpus}; torch {facts.get('torch')}, NCCL "
        f"{facts.get('nccl')}, transformers {facts.get('transformers')}; work {ctx.work}",
        flush=True,
    )
    results = []
    for name in names:
        results.append(run_scenario(ctx, name))
        print(line(results[-1]), flush=True)
    failed = [r.name for r in results if r.verdict == "FAIL"]
    counts = {v: sum(r.verdict == v for r in results) for v in ("ok", "FAIL", "skipped")}
    print(
        f"gpu-check: {counts['ok']} ok, {counts['FAIL']} FAIL, {counts['skipped']} skipped"
        + (f" ({', '.join(failed)}); logs under {ctx.work}" if failed else ""),
        flush=True,
    )
    if args.markdown:
        args.markdown.write_text(markdown(results, facts, gpus, ctx.device))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
