"""How each host runs the entry point (plan/launch_mode.py), in priority order, and what the plan
then gives the entry point that runs once: torchrun's one slot, the DLC's environment."""

from __future__ import annotations

import json
import os
import time

import pytest

from container_entry.plan.environment import code_key, read_code_files
from container_entry.plan.launch_mode import LaunchMode, launch_mode_of, other_launcher
from container_entry.plan.plan import build_plan
from tests.unit.conftest import NVIDIA_SMI_4, make_env

LAUNCHING = {"run.sh": b"#!/bin/bash\ntorchrun --nproc_per_node 8 train.py\n", "train.py": b""}
PLAIN = {"train.py": b"import torch\nprint('training')\n"}
WORLD = ("algo-1", "algo-2")


@pytest.mark.parametrize(
    ("setting", "hps", "world", "entry", "files", "mode", "why"),
    [
        ("auto", {}, WORLD, "train.py", PLAIN, LaunchMode.DDP, "launches no workers"),
        ("auto", {}, WORLD, "run.sh", LAUNCHING, LaunchMode.ONCE, "run.sh line 2 runs torchrun"),
        ("auto", {}, WORLD, None, None, LaunchMode.DDP, "decided once s3://b/c is here"),
        ("auto", {}, (), "train.py", PLAIN, LaunchMode.ONCE, "in no DDP world (why)"),
        ("ddp", {}, WORLD, "run.sh", LAUNCHING, LaunchMode.DDP, "LAUNCH=ddp (forced)"),
        ("ddp", {}, (), "run.sh", LAUNCHING, LaunchMode.ONCE, "in no DDP world"),  # no world
        ("once", {}, WORLD, "train.py", PLAIN, LaunchMode.ONCE, "LAUNCH=once (forced)"),
        ("auto", {"sagemaker_mpi_enabled": True}, WORLD, "train.py", PLAIN, LaunchMode.TOOLKIT,
         "MPI (sagemaker_mpi_enabled)"),
        ("auto", {"sagemaker_mpi_enabled": True}, (), "train.py", PLAIN, LaunchMode.TOOLKIT,
         "MPI"),  # the toolkit has its own group rule
        ("auto", {"mp_parameters": {"partitions": 2}}, WORLD, "train.py", PLAIN,
         LaunchMode.TOOLKIT, "the model-parallel library"),
        ("ddp", {"sagemaker_mpi_enabled": True}, WORLD, "train.py", PLAIN, LaunchMode.DDP,
         "forced"),
        ("once", {"sagemaker_mpi_enabled": True}, WORLD, "train.py", PLAIN, LaunchMode.ONCE,
         "forced"),
        ("auto", {"sagemaker_torch_distributed_enabled": True}, WORLD, "train.py", PLAIN,
         LaunchMode.DDP, "launches no workers"),
        ("auto", {"sagemaker_distributed_dataparallel_enabled": True}, WORLD, "train.py", PLAIN,
         LaunchMode.DDP, "launches no workers"),
    ],
)  # fmt: skip
def test_the_launch_mode_in_priority_order(setting, hps, world, entry, files, mode, why):
    decision = launch_mode_of(setting, hps, world, "why", entry, files, "s3://b/c")
    assert decision.mode is mode and why in decision.why, decision
    assert decision.pending is (files is None and mode is LaunchMode.DDP)


@pytest.mark.parametrize(
    ("hps", "other"),
    [
        ({"sagemaker_mpi_enabled": "true"}, "MPI"),
        ({"sagemaker_mpi_enabled": "false"}, None),
        ({"sagemaker_pytorch_xla_multi_worker_enabled": True}, "PyTorch XLA"),
        ({"mp_parameters": "{}"}, None),
        ({"mp_parameters": {}}, None),
        ({"mp_parameters": '{"partitions": 2}'}, "model-parallel"),
        ({"sagemaker_torch_distributed_enabled": True}, None),
    ],
)
def test_which_distribution_is_another_launcher(hps, other):
    found = other_launcher(hps)
    assert (found is None) if other is None else (other in (found or ""))


def once_plan(**kw):
    rc = {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth1"}
    env = make_env(
        resource_config=rc,
        nvidia_smi=NVIDIA_SMI_4,
        environ={"SAGEMAKER_PROGRAM": "run.sh", "PET_NPROC_PER_NODE": "8", **kw},
        code_files=LAUNCHING,
    )
    return build_plan(env)


def test_the_entry_point_once_gets_one_slot_on_a_port_of_the_kernels():
    plan = once_plan(CONTAINER_ENTRY_MASTER_PORT="29500")
    assert plan.launch.mode is LaunchMode.ONCE and plan.once
    argv = plan.argv
    assert "--standalone" in argv and argv[argv.index("--nproc-per-node") + 1] == "1"
    assert argv[argv.index("--local-addr") + 1] == "127.0.0.1"
    assert "--master-port" not in argv and "--node-rank" not in argv
    assert plan.workers == 1 and not plan.preflight and plan.max_restarts == 0
    assert not plan.hosts_store and not plan.dials_store  # no store of ours on MASTER_PORT
    assert plan.coordination_port == 29501  # the side channel stays where every host finds it


def test_the_entry_point_once_gets_the_dlcs_environment():
    plan = once_plan()
    env = {name: var.value for name, var in plan.env.items()}
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("algo-1", "7777")  # the DLC's toolkit's
    assert env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert not {"OMP_NUM_THREADS", "TORCH_FR_BUFFER_SIZE", "ACCELERATE_USE_CPU"} & set(env)
    assert json.loads(env["SM_TRAINING_ENV"])["master_hostname"] == "algo-1"
    assert "--nproc-per-node" in plan.argv and "PET_NPROC_PER_NODE" not in plan.user_env_kept


def test_the_code_folder_is_read_within_bounds(tmp_path):
    """The code folder may be `/` (`train /train.py`): read within its bounds at once; a FIFO
    named like a script is never opened (it would block)."""
    started = time.thread_time()  # its own CPU, far from what it takes (the wall clock stretches)
    files = read_code_files("/", "/nonexistent-entry.sh")
    assert time.thread_time() - started < 30 and len(files) <= 400
    assert all(len(text) <= 256 * 1024 for text in files.values())
    os.mkfifo(tmp_path / "run.sh")
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "notes.txt").write_text("torchrun\n")
    files = read_code_files(str(tmp_path), str(tmp_path / "run.sh"))
    assert files == {"train.py": b"print(1)\n"}
    assert code_key(str(tmp_path), str(tmp_path / "sub" / "x.sh")) == "sub/x.sh"
    assert code_key(str(tmp_path), "/elsewhere/x.sh") == "/elsewhere/x.sh"
