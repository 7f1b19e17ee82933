"""Hand-built Environments: the plan is pure, so unit tests need no files and no processes."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from container_entry.plan.environment import Environment

NVIDIA_SMI_4 = "\n".join(
    f"GPU {i}: NVIDIA A10G (UUID: GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd)" for i in range(4)
)


def make_env(**overrides: Any) -> Environment:
    values: dict[str, Any] = {
        "base_dir": Path("/opt/ml"),
        "environ": {"SAGEMAKER_PROGRAM": "train.py"},
        "resource_config": {
            "current_host": "algo-1",
            "hosts": ["algo-1"],
            "network_interface_name": "eth0",
        },
        "hyperparameters": {},
        "input_data_config": {"train": {"TrainingInputMode": "File"}},
        "nvidia_smi": None,
        "cpu_count": 8,
        "all_cpus": 8,
        "hostname": "container-abc",
        "python": "/opt/venv/bin/python",
        "torch_version": "2.9.0",
    }
    values.update(overrides)
    return Environment(**values)


@pytest.fixture
def env_factory():
    return make_env


def record_backoff(monkeypatch, module) -> list[float]:
    """The waits `module.backoff` hands out from now on, in order (the real function's), to the
    threads started from now on: a thread an earlier test left (a lookup that outlived its
    deadline, run 62) is not this test's."""
    real, scheduled = module.backoff, []
    earlier = frozenset(threading.enumerate())

    def recorded(attempt: int, cap: float, *args) -> float:
        wait = real(attempt, cap, *args)
        if threading.current_thread() not in earlier:
            scheduled.append(wait)
        return wait

    monkeypatch.setattr(module, "backoff", recorded)
    return scheduled
