"""What the installed torchrun can do and the command line we build for it (the real parsers of
every supported release check the same in tests/compat)."""

from __future__ import annotations

import pytest

from container_entry.common.errors import ConfigError
from container_entry.plan import torchrun
from container_entry.plan.cluster import Topology


@pytest.mark.parametrize(
    ("version", "release", "grace", "supported"),
    [
        ("2.9.0+cu128", (2, 9), False, True),
        ("2.11.1", (2, 11), False, True),
        ("2.12.0", (2, 12), True, True),
        ("2.15.0.dev20261201", (2, 15), True, True),
        ("2.4.1", (2, 4), False, False),
    ],
)
def test_the_release_decides_the_options(version, release, grace, supported):
    launcher = torchrun.Torchrun(version)
    assert launcher.release == release
    assert launcher.handles_stop_grace is grace and launcher.has("shutdown-timeout") is grace
    assert launcher.supported is supported


def test_a_version_that_is_not_a_release_number_is_a_config_error():
    with pytest.raises(ConfigError, match="'unknown' is not a release number"):
        torchrun.Torchrun("unknown").has("nnodes")


def test_a_user_pet_variable_drops_our_flag():
    argv, kept = torchrun.flags({"PET_NPROC_PER_NODE": "3"}, {"nnodes": "2", "nproc-per-node": "8"})
    assert argv == ["--nnodes", "2"] and kept == ["PET_NPROC_PER_NODE"]


def test_the_command_ends_with_our_worker_module_and_nothing_of_the_user_s():
    command = torchrun.command("/usr/local/bin/python3", ["--nnodes", "1"])
    assert command == (
        "/usr/local/bin/python3",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "-m",
        "container_entry.worker",
    )


def topology(hosts, current, coordinated=True) -> Topology:
    return Topology(
        source="sagemaker" if coordinated else "torchrun-env",
        hosts=tuple(hosts),
        current_host=current,
        node_rank=list(hosts).index(current),
        master_addr=hosts[0] if len(hosts) > 1 else "127.0.0.1",
        coordinated=coordinated,
        world=tuple(hosts),
    )


def test_static_rendezvous_without_restarts():
    two = topology(["algo-1", "algo-2"], "algo-2")
    flags = torchrun.rendezvous_flags(two, "algo-1", 29500, 0, "job-1")
    assert flags == {
        "node-rank": "1",
        "master-addr": "algo-1",
        "master-port": "29500",
        "max-restarts": "0",
    }


@pytest.mark.parametrize(
    ("hosts", "current", "coordinated", "local_addr", "is_host"),
    [
        (["algo-1"], "algo-1", True, "127.0.0.1", "true"),
        (["algo-1", "algo-2"], "algo-2", True, "algo-2", "false"),
        (["node-0", "node-1"], "node-0", False, None, "true"),  # torchrun-style env: FQDN
    ],
)
def test_c10d_rendezvous_with_restarts(hosts, current, coordinated, local_addr, is_host):
    flags = torchrun.rendezvous_flags(
        topology(hosts, current, coordinated), hosts[0], 29500, 3, None
    )
    assert flags["rdzv-backend"] == "c10d" and flags["max-restarts"] == "3"
    assert flags["rdzv-id"] == "container-entry"  # no job name: one fixed id
    assert flags["rdzv-conf"] == f"is_host={is_host}"
    assert flags.get("local-addr") == local_addr
