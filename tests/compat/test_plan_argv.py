"""The plan's torchrun command lines against the real argument parser of every supported torch.

`container_entry.plan.torchrun.FLAG_SINCE` must say exactly which releases have each option we pass,
and every command line the plan builds (one host, two hosts, restarts, a torchrun-style cluster,
the preflight) must parse, on each release, into what the plan meant: torchrun's options with
their values, then our worker module with no arguments at all. User arguments never reach the
parser: every prefix of every option a release has, used as a hyperparameter name, leaves the
command line unchanged.
"""

from __future__ import annotations

import argparse
import json

import pytest

from container_entry.common.programs import TORCHRUN_MODULE
from container_entry.plan import torchrun
from container_entry.plan.plan import build_plan
from tests.compat import torch_launchers as tl
from tests.compat.test_torch_launchers import TORCH_VERSIONS, no_pet_env, parse, parser
from tests.unit.conftest import NVIDIA_SMI_4, make_env

__all__ = ["no_pet_env"]  # autouse fixture: PET_* of this process must not leak into parsing

TWO_HOSTS = {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]}
SHAPES = {
    "one-host": {},
    "two-hosts": {"resource_config": TWO_HOSTS, "nvidia_smi": NVIDIA_SMI_4},
    "two-hosts-restarts": {
        "resource_config": TWO_HOSTS,
        "hyperparameters": {"container_entry_max_restarts": "2", "sagemaker_job_name": '"j"'},
    },
    "one-host-restarts": {"environ": {"SAGEMAKER_PROGRAM": "t.py", "PET_MAX_RESTARTS": "1"}},
    # the entry point once per host: one slot on a port of the kernel's, whatever PET_* say
    "once-per-host": {
        "resource_config": TWO_HOSTS,
        "environ": {
            "SAGEMAKER_PROGRAM": "run.sh",
            "CONTAINER_ENTRY_LAUNCH": "once",
            "PET_NPROC_PER_NODE": "4",
        },
    },
    "torchrun-env": {
        "resource_config": None,
        "cli_args": ("t.py",),
        "scripts_found": ("/t.py",),
        "environ": {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "m-0"},
    },
}


def release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


@pytest.mark.parametrize("version", TORCH_VERSIONS)
def test_flag_since_matches_every_release(version):
    options = tl.long_options(parser(version))
    for flag, since in torchrun.FLAG_SINCE.items():
        assert (f"--{flag}" in options) == (release(version) >= since), (flag, version)


def _check(version: str, argv: tuple[str, ...]) -> argparse.Namespace:
    assert argv[1:3] == ("-m", TORCHRUN_MODULE)
    namespace = parse(parser(version), list(argv[3:]))
    assert not isinstance(namespace, str), f"torch {version} rejects {argv[3:]}: {namespace}"
    assert namespace.module and namespace.training_script == torchrun.WORKER_MODULE
    assert namespace.training_script_args == []
    options = [a for a in argv[3:-2] if a != "--standalone"]  # the one switch without a value
    assert ("--standalone" in argv) == bool(namespace.standalone)
    flags = dict(zip(options[0::2], options[1::2], strict=True))
    for flag, value in flags.items():
        assert str(getattr(namespace, flag[2:].replace("-", "_"))) == value, flag
    return namespace


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("version", TORCH_VERSIONS)
def test_every_plan_parses_as_meant_on_every_release(version, shape):
    plan = build_plan(make_env(torch_version=version, **SHAPES[shape]))
    assert not plan.problems, plan.problems
    _check(version, plan.argv)  # the preflight runs inside this same launch
    has_timeout = "--shutdown-timeout" in plan.argv
    assert has_timeout == (release(version) >= (2, 12))


@pytest.mark.parametrize("version", ["2.9.1", TORCH_VERSIONS[-1]])
def test_no_user_argument_ever_reaches_torchruns_parser(version):
    """pytorch issue 120601: argparse matches abbreviations after the script name too."""
    options = sorted(tl.long_options(parser(version)))
    names = sorted(
        {option[2:][:length] for option in options for length in range(1, len(option) - 1)}
    )
    hyperparameters = {name: json.dumps(f"value of {name}") for name in names}
    plan = build_plan(make_env(torch_version=version, hyperparameters=hyperparameters))
    assert plan.argv == build_plan(make_env(torch_version=version)).argv
    _check(version, plan.argv)
    received = dict(zip(plan.command[1::2], plan.command[2::2], strict=True))
    assert {k.lstrip("-") for k in received} == set(names)
    assert all(received[k] == f"value of {k.lstrip('-')}" for k in received)


def test_releases_older_than_the_oldest_supported_are_a_problem():
    plan = build_plan(make_env(torch_version="2.4.1"))
    assert plan.problems and "older than the oldest supported release (2.5)" in plan.problems[0]
    assert TORCH_VERSIONS[0].startswith(".".join(map(str, torchrun.OLDEST)))
