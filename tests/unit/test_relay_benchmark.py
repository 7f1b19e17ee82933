"""The relay benchmark's commands and table (scripts/relay_benchmark.py): both launchers in the
same image, the HF Trainer row, the goals; the runs themselves are `make bench`'s."""

from __future__ import annotations

from pathlib import Path

from scripts import relay_benchmark as bench


def test_both_launchers_run_in_containers_of_the_same_image():
    base = Path("/tmp/relay-bench-x")
    ours, _ = bench.command("ours", base, ["--steps", "5"], 29600, "img:1", hf=False)
    bare, _ = bench.command("torchrun", base, ["--steps", "5"], 29600, "img:1", hf=False)
    for argv in (ours, bare):
        assert argv[:3] == ["docker", "run", "--rm"] and "img:1" in argv
        assert "--env=OMP_NUM_THREADS=1" in argv and f"{base}:/opt/ml" in argv
    assert ours[ours.index("img:1") + 1 :] == ["train", "relay_workload.py", "--steps", "5"]
    assert bare[bare.index("img:1") + 1 :][:3] == ["python3", "-m", "torch.distributed.run"]
    assert "--env=PET_NPROC_PER_NODE=2" in ours and "SAGEMAKER_BASE_DIR" not in str(ours)


def test_the_hf_job_under_bare_torchrun_gets_what_the_bootstrap_sets_on_cpu():
    bare, _ = bench.command("torchrun", Path("/b"), [], 1, "img:1", hf=True)
    assert "--env=ACCELERATE_USE_CPU=true" in bare and "--env=SUMMARY_DIR=/opt/ml/result" in bare
    assert bare[-1] == "/opt/ml/code/hf_trainer_tiny.py"


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
    table = bench.render(results, meta)
    assert "in containers of the image `img:1`" in table and "torch 2.9.0" in table
    assert "| 1, stdout | 105.0 (100.0-110.0) | 105.0 (99.0-111.0) |" in table
    hf_rows = [line for line in table.splitlines() if line.startswith("| HF Trainer job")]
    assert len(hf_rows) == 1 and "0.91x" in hf_rows[0] and "**no**" in hf_rows[0]
    assert bench.scenario("hf") == (0, "hf") and bench.scenario("20:stderr") == (20, "stderr")
