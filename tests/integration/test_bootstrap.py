"""The bootstrap in real processes: real torchrun, real gloo workers, real files."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time

import pytest

from tests.integration.conftest import (
    PROBE,
    TRAINER,
    bootstrap_argv,
    bootstrap_env,
    make_tree,
    run,
    with_hosts_file,
)
from tests.ports import job_port

V2_HPS = {  # SDK v2 framework estimator encoding: every value JSON-encoded
    "epochs": "3",
    "learning-rate": "0.005",
    "model-type": '"bert"',
    "note": json.dumps("two words; $(not run)"),
    "sagemaker_program": '"hf_trainer_tiny.py"',
    "sagemaker_container_log_level": "20",
    "sagemaker_region": '"us-east-1"',
}


def test_hf_trainer_runs_as_two_worker_ddp_on_cpu(tmp_path):
    tree = make_tree(tmp_path, hyperparameters=V2_HPS, script=TRAINER)
    (tree.base / "model").mkdir()
    (tree.base / "model" / "keep-me.txt").write_text("user file")
    result = run(bootstrap_argv(), bootstrap_env(tree, PET_NPROC_PER_NODE="2"), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    summaries = tree.summaries("rank-*.json")
    assert [s["rank"] for s in summaries] == [0, 1]
    for summary in summaries:
        assert summary["world_size"] == 2 and summary["args_world_size"] == 2
        assert "DISTRIBUTED" in summary["parallel_mode"].upper()
        assert math.isfinite(summary["first_loss"]) and math.isfinite(summary["last_loss"])
        assert summary["last_loss"] < summary["first_loss"]
    assert summaries[0]["argv"] == summaries[1]["argv"]
    argv = summaries[0]["argv"]
    assert argv[argv.index("--note") + 1] == "two words; $(not run)"
    assert not any(a.startswith("--sagemaker") for a in argv)

    model_files = sorted(p.name for p in (tree.base / "model").iterdir())
    assert len([n for n in model_files if n.endswith(".safetensors")]) == 1, model_files
    assert (tree.base / "model" / "keep-me.txt").read_text() == "user file"
    assert (tree.output / "success").exists() and not (tree.output / "failure").exists()


def test_two_hosts_on_one_machine(tmp_path, hosts_file):
    hosts = ("algo-1", "algo-2")
    trees = [make_tree(tmp_path, current_host=h, hosts=hosts) for h in hosts]
    hps_program = {
        "SAGEMAKER_PROGRAM": "ddp_probe.py",
        "PET_NPROC_PER_NODE": "2",
        "CONTAINER_ENTRY_MASTER_PORT": str(job_port()),
    }
    processes = [
        subprocess.Popen(
            with_hosts_file(bootstrap_argv(), hosts_file),
            env=bootstrap_env(tree, **hps_program),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for tree in trees
    ]
    outputs = [p.communicate(timeout=180)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    cores = len(os.sched_getaffinity(0))
    for host, output in zip(hosts, outputs, strict=True):  # preflight is on for 2+ hosts
        assert f"preflight ok on {host}: 2 workers, 0 GPUs, all_reduce latency" in output
        # one kernel, two hosts: the machine's cores are divided among all 4 workers
        assert f"{cores} cores / 4 workers (2 hosts of this job share this machine" in output
    ranks = {}
    for host, tree in zip(hosts, trees, strict=True):
        for summary in tree.summaries("probe-rank-*.json"):
            assert summary["world_size"] == 4
            assert summary["all_reduce"] == 1 + 2 + 3 + 4
            assert summary["host"] == host
            assert summary["env"]["GLOO_SOCKET_IFNAME"] == "lo"
            assert summary["env"]["OMP_NUM_THREADS"] == str(max(1, cores // 4))
            ranks[summary["rank"]] = host
        assert (tree.output / "success").exists()
    assert ranks == {0: "algo-1", 1: "algo-1", 2: "algo-2", 3: "algo-2"}


def test_peer_that_never_resolves_fails_fast_with_a_failure_file(tmp_path, hosts_file):
    tree = make_tree(tmp_path, current_host="algo-1", hosts=("algo-1", "algo-9"))
    env = bootstrap_env(
        tree, SAGEMAKER_PROGRAM="ddp_probe.py", CONTAINER_ENTRY_HOST_WAIT_TIMEOUT="3"
    )
    started = time.monotonic()
    result = run(with_hosts_file(bootstrap_argv(), hosts_file), env, timeout=60)
    assert result.returncode == 3
    assert time.monotonic() - started < 30
    failure = (tree.output / "failure").read_text()
    assert "algo-9" in failure and "did not resolve within 3 s" in failure


def test_local_mode_script_and_args_on_the_command_line(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import sys, os; print('ARGS', sys.argv[1:], os.environ['WORLD_SIZE'])\n")
    base = tmp_path / "ml"  # no resourceconfig: local mode
    env = bootstrap_env(make_tree_stub(base))
    result = run(bootstrap_argv(str(script), "--x", "a b", "$(id)"), env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ARGS ['--x', 'a b', '$(id)'] 1" in result.stdout
    assert "mode        local" in result.stderr


def make_tree_stub(base):
    from tests.integration.conftest import MlTree

    base.mkdir(parents=True)
    return MlTree(base)


@pytest.mark.parametrize("script", ["absolute", "relative"])
def test_torchrun_style_environment_only_two_nodes(tmp_path, script):
    """Kubernetes-style: PET_* only, no SageMaker files; the script from the command line, by
    its path or (`train ddp_probe.py` from /, the code in <base>/code) by its name."""
    processes = []
    port = str(job_port())
    for rank in (0, 1):
        base = tmp_path / f"node-{rank}"
        tree = make_tree_stub(base)
        argv = bootstrap_argv(str(PROBE))
        if script == "relative":
            (base / "code").mkdir()
            (base / "code" / "ddp_probe.py").write_bytes(PROBE.read_bytes())
            argv = bootstrap_argv("ddp_probe.py")
        env = bootstrap_env(
            tree,
            PET_NNODES="2",
            PET_NODE_RANK=str(rank),
            PET_MASTER_ADDR="127.0.0.1",
            PET_MASTER_PORT=port,
            PET_NPROC_PER_NODE="1",
            SM_OUTPUT_DATA_DIR=str(base),
        )
        processes.append(
            subprocess.Popen(
                argv,
                env=env,
                cwd="/",  # docker run's working directory
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=180)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    assert "mode        torchrun-env" in outputs[0]
    for rank in (0, 1):
        summary = json.loads((tmp_path / f"node-{rank}" / f"probe-rank-{rank}.json").read_text())
        assert summary["world_size"] == 2 and summary["all_reduce"] == 3
