"""The GPU paths on a machine without a GPU: real bootstrap and torch processes, with fakes
standing in for what cannot exist here. Each test says what its fake stands in for."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from container_entry.rank.torch_gpus import check_visible_gpus
from tests.integration.conftest import bootstrap_argv, bootstrap_env, make_tree, run


def fake_binary(folder: Path, name: str, script: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


def with_fake_driver(argv: list[str], driver_root: Path) -> list[str]:
    """Run argv where /proc/driver is `driver_root` (a private mount namespace; needs root):
    stands in for the NVIDIA kernel driver's /proc/driver/nvidia/gpus/<pci id> entries."""
    script = 'mount --bind "$0" /proc/driver && exec "$@"'
    return ["unshare", "--mount", "--", "sh", "-c", script, str(driver_root), *argv]


@pytest.fixture
def root_namespaces():
    if os.geteuid() != 0:
        pytest.fail("this test needs root for a private mount namespace (CI runs as root)")


SMI_FAILURES = [
    # stands in for a driver/library mismatch: NVIDIA's own message, a non-zero exit
    (
        "exits-9",
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."'
        " >&2\nexit 9\n",
        "`nvidia-smi -L` failed: exit code 9: NVIDIA-SMI has failed because it couldn't "
        "communicate with the NVIDIA driver.",
    ),
    # stands in for a wedged driver: the query never answers (gpus.QUERY_TIMEOUT, 30 s)
    ("hangs", "exec sleep 600\n", "`nvidia-smi -L` failed: no answer within 30 s"),
    # (no nvidia-smi at all with /dev/nvidia* mapped in: tests/unit/test_gpus.py; with only the
    # host's /proc/driver entries it is `docker run` without --gpus: CPU, with a warning)
]


@pytest.mark.parametrize(
    ("name", "script", "problem"), SMI_FAILURES, ids=[case[0] for case in SMI_FAILURES]
)
def test_a_failing_nvidia_smi_on_a_driver_host_is_refused_not_run_on_cpu(
    tmp_path, root_namespaces, name, script, problem
):
    """A fake /proc/driver/nvidia/gpus stands in for the driver of an 8-GPU host; the fake
    `nvidia-smi` (or its absence) for the ways its query fails there."""
    bin_dir = tmp_path / "bin"
    fake_binary(bin_dir, "nvidia-smi", script)
    driver = tmp_path / "driver"
    for index in range(8):
        (driver / "nvidia" / "gpus" / f"0000:{16 + index:02x}:1c.0").mkdir(parents=True)
    tree = make_tree(tmp_path)
    path = ":".join(p for p in os.environ["PATH"].split(":") if not Path(p, "nvidia-smi").exists())
    env = bootstrap_env(tree, PATH=f"{bin_dir}:{path}")
    env["SAGEMAKER_PROGRAM"] = "ddp_probe.py"

    plan = run(with_fake_driver([*bootstrap_argv()[:-1], "plan"], driver), env, timeout=90)
    assert plan.returncode == 2, plan.stderr  # `plan`: exit 2 whenever it lists problems
    data = json.loads(plan.stdout)
    assert data["num_gpus"] == 8 and data["backend"] == "nccl"
    assert "ACCELERATE_USE_CPU" not in data["env"]
    assert any(problem in p for p in data["problems"]), data["problems"]
    if name == "hangs":
        return  # `train` would wait the same 30 s to say the same

    done = run(with_fake_driver(bootstrap_argv(), driver), env, timeout=90)
    assert done.returncode == 4, done.stderr[-2000:]  # this host's GPUs are not usable
    failure = (tree.output / "failure").read_text()
    assert problem in failure and failure.count("\n") == 1, failure
    assert "started rank" not in done.stdout


def test_preflight_deadline_names_the_rank_stuck_before_joining(tmp_path):
    """The stall hook stands in for a rank hung in a CUDA call (a wedged GPU) before it joins:
    the deadline names that rank and its stage, not the rank that waited for it."""
    tree = make_tree(tmp_path)
    env = bootstrap_env(
        tree,
        SAGEMAKER_PROGRAM="ddp_probe.py",
        PET_NPROC_PER_NODE="2",
        CONTAINER_ENTRY_PREFLIGHT="true",
        _CONTAINER_ENTRY_PREFLIGHT_DEADLINE="25",
        _CONTAINER_ENTRY_PREFLIGHT_STALL="1:gpu-count",
        CONTAINER_ENTRY_HANG_TIMEOUT="10",  # the preflight's own deadline speaks, not the watchdog
    )
    done = run(bootstrap_argv(), env, timeout=180)
    # a peer never joined (docs/failure-stop-logs.md, exit codes)
    assert done.returncode == 3, done.stderr[-3000:]
    line = (tree.output / "failure").read_text().splitlines()[0]
    assert line.startswith("preflight failed, the script did not start"), line
    assert "preflight check 'deadline' failed on host algo-1" in line, line
    assert "rank 1 (local 1) on algo-1 still in 'gpu-count' (for " in line, line
    assert "1 other rank(s) got further" in line, line
    assert "started rank" not in done.stdout


@pytest.mark.parametrize("stage", ["connect", "gpu-count", "join", "bandwidth"])
def test_a_slow_preflight_is_no_hang_and_the_script_gets_its_own_start_up(tmp_path, stage):
    """A rank slower in the preflight than HANG_TIMEOUT, at any stage, is not a hang: the
    preflight has its own deadline. The script's start-up then counts from its own start."""
    tree = make_tree(tmp_path)
    env = bootstrap_env(
        tree,
        SAGEMAKER_PROGRAM="ddp_probe.py",
        PET_NPROC_PER_NODE="2",
        CONTAINER_ENTRY_PREFLIGHT="true",
        # the script's start-up after the preflight stays below it, beside a busy suite with
        # a busy loop per CPU too (8 s did not without the loop, 12 s not with it); the stall
        # outlasts it
        CONTAINER_ENTRY_HANG_TIMEOUT="20",
        _CONTAINER_ENTRY_PREFLIGHT_STALL=f"1:{stage}:28",
    )
    done = run(bootstrap_argv(), env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hung" not in done.stdout + done.stderr
    assert "preflight ok on algo-1" in done.stdout
    assert "probe rank 1/2 host algo-1 sum " in done.stdout  # the script ran after it


@pytest.mark.parametrize("workers", [2, 1])
def test_preflight_passes_on_cpu_with_bus_bandwidth(tmp_path, workers):
    """A world of 2 prints its latency and bus bandwidth; a world of 1 has no link to time and
    says what it checked instead (an H200 alone printed '15201.31 GB/s' for a no-op)."""
    tree = make_tree(tmp_path)
    env = bootstrap_env(
        tree,
        SAGEMAKER_PROGRAM="ddp_probe.py",
        PET_NPROC_PER_NODE=str(workers),
        CONTAINER_ENTRY_PREFLIGHT="true",
    )
    done = run(bootstrap_argv(), env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    if workers == 2:
        assert "preflight ok on algo-1: 2 workers, 0 GPUs, all_reduce latency" in output
        assert "bus bandwidth" in output and "(4 MiB, world 2)" in output
    else:
        line = next(x for x in output.splitlines() if "preflight ok on algo-1" in x)
        assert "1 workers, 0 GPUs, all_reduce result checked (world 1: no link" in line, line
        assert "bandwidth" not in line.split("no link")[0] and "GB/s" not in line, line


def test_gpu_check_with_the_real_torch_of_this_venv():
    """This venv's torch is a CUDA build on a machine without a GPU: it sees 0 devices."""
    line = check_visible_gpus(sys.executable, 2, dict(os.environ), timeout=120)
    assert line is not None and "sees 0 GPUs, but 2 GPUs were counted" in line, line
    assert "CUDA runtime" in line and "NVIDIA driver" in line
    assert check_visible_gpus(sys.executable, 0, dict(os.environ)) is None


def test_gpu_check_names_an_old_driver(tmp_path):
    """A fake python printing the probe's answer stands in for torch on a p5 whose driver
    (535, CUDA 12.2) is older than torch's CUDA runtime (13.0)."""
    answer = {
        "torch": "2.9.0+cu130",
        "cuda": "13.0",
        "count": 0,
        "driver_cuda": 12020,
        "driver": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12",
        "warnings": [
            "CUDA initialization: The NVIDIA driver on your system is too old (found version "
            "12020)."
        ],
    }
    python = fake_binary(tmp_path, "python", f"echo '{json.dumps(answer)}'\n")
    line = check_visible_gpus(str(python), 8, {})
    assert line == (
        "torch 2.9.0+cu130 sees 0 GPUs, but 8 GPUs were counted; NVIDIA driver 535.183.01 "
        "(supports CUDA 12.2), CUDA runtime 13.0; torch said: CUDA initialization: The NVIDIA "
        "driver on your system is too old (found version 12020)."
    )
    fine = fake_binary(tmp_path, "python8", """echo '{"torch": "2.9.0", "count": 8}'\n""")
    assert check_visible_gpus(str(fine), 8, {}) is None
    hung = fake_binary(tmp_path, "hung", "exec sleep 30\n")
    assert "did not answer within 1 s" in check_visible_gpus(str(hung), 8, {}, timeout=1)
    broken = fake_binary(tmp_path, "broken", "echo 'Segmentation fault' >&2; exit 139\n")
    assert "exit code 139: Segmentation fault" in check_visible_gpus(str(broken), 8, {})


def test_gpu_check_environment_reaches_the_probe(tmp_path):
    """CUDA_VISIBLE_DEVICES of the workers is what the probe sees (a fake python echoes it)."""
    python = fake_binary(
        tmp_path,
        "python",
        'n=$(echo "$CUDA_VISIBLE_DEVICES" | tr , "\\n" | grep -c .)\n'
        'echo "{\\"torch\\": \\"x\\", \\"count\\": $n}"\n',
    )
    assert check_visible_gpus(str(python), 2, {"CUDA_VISIBLE_DEVICES": "0,1"}) is None
    assert "sees 1 GPU," in check_visible_gpus(str(python), 2, {"CUDA_VISIBLE_DEVICES": "3"})
