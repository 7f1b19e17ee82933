"""The relay benchmark's commands and table (scripts/relay_benchmark*.py): both launchers in the
same image, the HF Trainer row, the goals; the runs themselves are `make bench`'s."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts.bench import relay as relay_benchmark
from scripts.bench import relay_report as relay_benchmark_report
from scripts.bench import relay_run as relay_benchmark_run


def test_both_launchers_run_in_containers_of_the_same_image():
    base = Path("/tmp/relay-bench-x")
    ours, _ = relay_benchmark_run.command("ours", base, ["--steps", "5"], 29600, "img:1", hf=False)
    bare, _ = relay_benchmark_run.command(
        "torchrun", base, ["--steps", "5"], 29600, "img:1", hf=False
    )
    for argv in (ours, bare):
        assert argv[:3] == ["docker", "run", "--rm"] and "img:1" in argv
        assert "--env=OMP_NUM_THREADS=1" in argv and f"{base}:/opt/ml" in argv
    assert ours[ours.index("img:1") + 1 :] == ["train", "relay_workload.py", "--steps", "5"]
    assert bare[bare.index("img:1") + 1 :][:3] == ["python3", "-m", "torch.distributed.run"]
    assert "--env=PET_NPROC_PER_NODE=2" in ours and "SAGEMAKER_BASE_DIR" not in str(ours)


def test_the_hf_job_under_bare_torchrun_gets_what_the_bootstrap_sets_on_cpu():
    bare, _ = relay_benchmark_run.command("torchrun", Path("/b"), [], 1, "img:1", hf=True)
    assert "--env=ACCELERATE_USE_CPU=true" in bare and "--env=SUMMARY_DIR=/opt/ml/result" in bare
    assert bare[-1] == "/opt/ml/code/hf_trainer_tiny.py"


def test_launcher_before_runs_the_other_container_entry_on_this_host():
    base = Path("/tmp/relay-bench-x")
    argv, env = relay_benchmark_run.command(
        "before", base, [], 29600, None, hf=False, before=Path("/old")
    )
    assert argv[1:4] == ["-m", "container_entry", "train"] and env["PYTHONPATH"] == "/old"
    assert env["SAGEMAKER_BASE_DIR"] == str(base) and env["CONTAINER_ENTRY_MASTER_PORT"] == "29600"
    _, ours = relay_benchmark_run.command("ours", base, [], 29600, None, hf=False)
    assert ours.get("PYTHONPATH") == os.environ.get("PYTHONPATH")


def run(steps_per_s: float, relay_cpu: float = 1.0) -> dict:
    return {
        "steps_per_s": steps_per_s,
        "lines": 1000,
        "relay_cpu": relay_cpu,
        "cpu": {"wrapper": relay_cpu, "bootstrap": 0.0},
        "job_cpu": None,
    }


def test_the_table_has_the_goals_and_the_hf_row_and_no_cpu_row_for_it():
    results = {
        (1, "stdout"): {"torchrun": [run(100), run(110)], "ours": [run(99), run(111)]},
        (0, "hf"): {"torchrun": [run(20), run(22)], "ours": [run(18), run(20)]},
    }
    meta = {
        "when": "now",
        "cpus": 2,
        "python": "3.12.1",
        "torch": "2.9.0",
        "rounds": 2,
        "steps": 3000,
        "idle": 0.8,
        "idle_seen": 0.9,
        "image": "img:1",
        "invocation": "make bench",
    }
    table = relay_benchmark_report.render(results, meta)
    assert "in containers of the image `img:1`" in table and "torch 2.9.0" in table
    assert "| 1, stdout | 105.0 (100.0-110.0) | 105.0 (99.0-111.0) |" in table
    hf_rows = [line for line in table.splitlines() if line.startswith("| HF Trainer job")]
    assert len(hf_rows) == 1 and "0.91x" in hf_rows[0] and "**no**" in hf_rows[0]
    assert relay_benchmark.scenario("hf") == (0, "hf") and relay_benchmark.scenario(
        "20:stderr"
    ) == (20, "stderr")


def measured(steps_per_s: float, seed: int, job_cpu: float | None, relay: float) -> dict:
    """One run as run_once records it, every CPU role filled."""
    cpu = {
        "wrapper": relay * (0.4 + seed / 10),
        "bootstrap": relay * 0.1 * seed,
        "torchrun": 0.2,
        "script": 9.0,
    }
    return {
        "steps_per_s": steps_per_s,
        "lines": 58000 + 1000 * seed,
        "relay_cpu": cpu["wrapper"] + cpu["bootstrap"],
        "cpu": cpu,
        "job_cpu": job_cpu,
    }


def rounds(*rates: float, job_cpu: float | None = None, relay: float = 1.0) -> list[dict]:
    return [
        measured(rate, seed, None if job_cpu is None else job_cpu + seed, relay)
        for seed, rate in enumerate(rates)
    ]


# every column: before and unbuffered launchers, an HF row, the job's CPU on this host
FULL_RESULTS = {
    (1, "stdout"): {
        "torchrun": rounds(300.0, 310.5, 295.25, job_cpu=40.0),
        "ours": rounds(297.0, 305.0, 299.0, job_cpu=42.5),
        "before": rounds(250.0, 260.0, 255.5, job_cpu=45.0, relay=2.5),
        "torchrun-u": rounds(290.0, 300.0, 280.0, job_cpu=41.0),
    },
    (20, "stderr"): {
        "torchrun": rounds(120.0, 118.0, 121.0, job_cpu=50.0),
        "ours": rounds(110.0, 116.0, 119.5, job_cpu=60.0, relay=1.5),
        "before": rounds(80.0, 85.0, 90.0, job_cpu=70.0, relay=4.0),
        "torchrun-u": rounds(100.0, 101.0, 99.0, job_cpu=51.0),
    },
    (0, "hf"): {
        "torchrun": rounds(20.0, 21.0, 19.5),
        "ours": rounds(19.8, 21.2, 19.0),
        "before": rounds(18.0, 20.0, 19.0),
        "torchrun-u": rounds(20.5, 20.0, 19.9),
    },
}
FULL_META = {
    "when": "2026-12-04 15:15 UTC",
    "invocation": "make bench-relay ARGS='--rounds 3'",
    "image": None,
    "cpus": 2,
    "python": "3.11.7",
    "torch": "2.9.0",
    "rounds": 3,
    "steps": 3000,
    "hf_epochs": 16,
    "idle": 0.8,
    "idle_seen": 0.97,
}
# runs in containers, saved before the HF epochs and the invocation were recorded
IMAGE_RESULTS = {
    (1, "stderr"): {"torchrun": rounds(200.0, 210.0), "ours": rounds(190.0, 220.0)},
    (0, "hf"): {"torchrun": rounds(20.0, 22.0), "ours": rounds(18.0, 20.0)},
}
IMAGE_META = {
    "when": "2026-12-03 10:00 UTC",
    "image": "container-entry:bench",
    "cpus": 4,
    "python": "3.12.1",
    "torch": "2.9.0",
    "rounds": 2,
    "steps": 1000,
    "idle": 0.0,
    "idle_seen": 1.0,
}
SNAPSHOTS = {
    "relay-benchmark-host.md": (FULL_RESULTS, FULL_META),
    "relay-benchmark-image.md": (IMAGE_RESULTS, IMAGE_META),
}


@pytest.mark.parametrize("name", sorted(SNAPSHOTS))
def test_the_table_renders_as_the_snapshot(name: str) -> None:
    """The block written into docs/benchmarks.md, byte for byte; regenerate after a deliberate
    change with UPDATE_SNAPSHOTS=1 and review the diff."""
    path = Path(__file__).parent / "snapshots" / name
    text = relay_benchmark_report.render(*SNAPSHOTS[name]) + "\n"
    if os.environ.get("UPDATE_SNAPSHOTS"):
        path.write_text(text)
    assert text == path.read_text(), f"table changed: UPDATE_SNAPSHOTS=1 and review {path}"
