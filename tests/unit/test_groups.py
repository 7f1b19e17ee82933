"""The instance-group rule (plan/groups.py) against sagemaker-training 5.1.4's own, run for real.

Every host of every layout is planned by us and by the toolkit (`Environment()` in a subprocess
of the dev venv, on the same files). Where the toolkit launches (the host's group is among its
distribution groups: the hyperparameter, or a launcher flag), our world is its
`distribution_hosts` in the same order, with its master and the host's index as node rank;
where the job names distribution groups and the host is outside them, it runs the script once
under both. Only where the DLC forms no world at all (no key, no flag) do we decide: one world
per instance group (never across groups), or the sorted hosts of a job with one group or none.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from container_entry.common.errors import ConfigError
from container_entry.plan.cluster import resolve_topology
from container_entry.plan.launch_mode import LaunchMode
from container_entry.plan.plan import build_plan
from tests.sm_contract import run_toolkit
from tests.unit.conftest import make_env

GUIDE = [  # the AWS guide's heterogeneous cluster: a CPU group beside a GPU group, unsorted
    {"instance_group_name": "data", "instance_type": "ml.c5.18xlarge", "hosts": ["algo-2"]},
    {
        "instance_group_name": "train",
        "instance_type": "ml.p4d.24xlarge",
        "hosts": ["algo-3", "algo-1"],
    },
]
THREE = [
    {"instance_group_name": "a", "instance_type": "ml.g5.xlarge", "hosts": ["algo-4", "algo-1"]},
    {"instance_group_name": "b", "instance_type": "ml.c5.xlarge", "hosts": ["algo-3"]},
    {"instance_group_name": "c", "instance_type": "ml.g5.xlarge", "hosts": ["algo-5", "algo-2"]},
]
ONE_GROUP = [
    {"instance_group_name": "homogeneousCluster", "instance_type": "ml.g5.12xlarge",
     "hosts": ["algo-2", "algo-1"]},
]  # fmt: skip
KEY = "sagemaker_distribution_instance_groups"
TORCHRUN = {"sagemaker_torch_distributed_enabled": "true"}
LAYOUTS: dict[str, tuple[list[dict[str, Any]], dict[str, str]]] = {
    "guide-no-key": (GUIDE, {}),
    "guide-key-train": (GUIDE, {KEY: '["train"]'}),
    "guide-key-train-mpi": (GUIDE, {KEY: '["train"]', "sagemaker_mpi_enabled": "true"}),
    "guide-key-both": (GUIDE, {KEY: '["data", "train"]'}),
    "guide-key-empty": (GUIDE, {KEY: "[]"}),
    "guide-key-raw-string": (GUIDE, {KEY: "train"}),
    "guide-flag-no-key": (GUIDE, TORCHRUN),
    "three-no-key": (THREE, {}),
    "three-key-a-c": (THREE, {KEY: '["c", "a"]'}),
    "three-flag": (THREE, TORCHRUN),
    "one-group-unsorted-flag": (ONE_GROUP, TORCHRUN),
    "one-group-unsorted": (ONE_GROUP, {}),
    "no-groups-flag": ([], TORCHRUN),
    "no-groups": ([], {}),
}


def resource_config(groups: list[dict[str, Any]], host: str) -> dict[str, Any]:
    hosts = sorted({h for g in groups for h in g["hosts"]} or {"algo-1", "algo-2"})
    config: dict[str, Any] = {"current_host": host, "hosts": hosts}
    if groups:
        current = next(g for g in groups if host in g["hosts"])
        config.update(current_group_name=current["instance_group_name"], instance_groups=groups)
        config["current_instance_type"] = current["instance_type"]
    return config


def cases() -> dict[str, dict[str, Any]]:
    """Every (layout, host) as the toolkit's configuration."""
    found = {}
    for layout, (groups, hps) in LAYOUTS.items():
        for host in resource_config(groups, "algo-1")["hosts"]:
            rc = resource_config(groups, host)
            found[f"{layout}@{host}"] = {"rc": rc, "hps": hps, "idc": {}, "environ": {}}
    return found


@pytest.fixture(scope="module")
def toolkit(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """The toolkit's Environment on every case: its SM_TRAINING_ENV object."""
    root = tmp_path_factory.mktemp("groups")
    base = root / "opt" / "ml"
    (base / "input" / "config").mkdir(parents=True)
    environ = {"PATH": os.environ.get("PATH", ""), "HOME": str(root), "AWS_REGION": "us-east-1"}
    results = run_toolkit(cases(), root, {**environ, "SAGEMAKER_BASE_DIR": str(base)})
    return {name: json.loads(result["SM_TRAINING_ENV"]) for name, result in results.items()}


@pytest.mark.parametrize("name", sorted(cases()))
def test_our_worlds_are_the_toolkits_where_it_forms_one(toolkit, name):
    spec, theirs = cases()[name], toolkit[name]
    plan = build_plan(make_env(resource_config=spec["rc"], hyperparameters=spec["hps"]))
    topology = plan.topology
    launches = theirs["current_instance_group"] in theirs["distribution_instance_groups"]
    if launches:  # the toolkit forms a world here: ours is the same, in the same order
        assert topology.world == tuple(theirs["distribution_hosts"])
        assert topology.node_rank == theirs["distribution_hosts"].index(topology.current_host)
        assert topology.master_addr in (theirs["master_hostname"], "127.0.0.1")
        assert len(topology.world) > 1 or topology.master_addr == "127.0.0.1"
    elif KEY in spec["hps"] or any(k.endswith("_enabled") for k in spec["hps"]):
        assert topology.world == () and plan.launch.mode in (LaunchMode.ONCE, LaunchMode.TOOLKIT)
    else:  # the DLC forms no world: ours, a world per group, or every host sorted
        groups = spec["rc"].get("instance_groups") or []
        if len(groups) > 1:
            mine = next(g for g in groups if topology.current_host in g["hosts"])
            assert topology.world == tuple(mine["hosts"])
        else:
            assert topology.world == tuple(sorted(spec["rc"]["hosts"]))
        assert plan.launch.mode is LaunchMode.DDP
    # is_master / master_hostname: our world's rank 0 where we form a world, else the DLC's
    mine = json.loads(plan.env["SM_TRAINING_ENV"].value)
    if plan.launch.mode is LaunchMode.DDP:
        assert mine["master_hostname"] == topology.world[0]
    else:
        assert mine["master_hostname"] == theirs["master_hostname"]
    assert mine["is_master"] is (mine["master_hostname"] == topology.current_host)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_host_agrees_on_the_worlds_and_one_coordinator(layout):
    """Every host computes the same worlds and the same side-channel host, whatever host it is."""
    groups, hps = LAYOUTS[layout]
    hosts = resource_config(groups, "algo-1")["hosts"]
    seen = set()
    for host in hosts:
        topology = resolve_topology(
            make_env(resource_config=resource_config(groups, host), hyperparameters=hps)
        )
        seen.add((topology.worlds, topology.coordinator))
        assert topology.hosts == tuple(hosts)  # the side channel spans the job
    assert len(seen) == 1
    worlds, coordinator = seen.pop()
    assert worlds is not None
    covered = [h for world in worlds.worlds for h in world] + list(worlds.once)
    assert sorted(covered) == hosts  # each host in exactly one world, or once
    assert coordinator in hosts and (
        not worlds.worlds or coordinator == max(worlds.worlds, key=len)[0]
    )


@pytest.mark.parametrize(
    ("groups", "hps", "message"),
    [
        (GUIDE, {KEY: '["nope"]'}, "names instance groups this job does not have: ['nope']"),
        (GUIDE, {KEY: '{"train": 1}'}, "a JSON list of instance group names"),
        ([], {KEY: '["train"]'}, "does not have: ['train']"),
        (
            [*GUIDE, {"instance_group_name": "data", "instance_type": "x", "hosts": []}],
            {},
            "instance group 'data' is listed twice",
        ),
        (
            [GUIDE[0], {**GUIDE[1], "hosts": ["algo-3", "algo-1", "algo-2"]}],
            {},
            "host 'algo-2' is in two instance groups",
        ),
        ([{"instance_type": "x", "hosts": ["algo-1"]}], {}, "has no 'instance_group_name'"),
    ],
)
def test_groups_that_contradict_themselves_are_one_line(groups, hps, message):
    rc = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2", "algo-3"]}
    if groups:
        rc["instance_groups"] = groups
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        resolve_topology(make_env(resource_config=rc, hyperparameters=hps))


@pytest.mark.parametrize("layout", ["guide-no-key", "guide-key-train", "three-no-key"])
def test_sdk_v3s_source_code_start_gets_the_same_worlds(layout):
    """SDK v3 passes instance groups only in resourceconfig.json (Compute(instance_groups=...)):
    taking over its `source_code` start changes no host's world, once mode or coordinator."""
    from tests.unit.test_sdk_driver import JOB, sdk_env

    groups, hps = LAYOUTS[layout]
    for host in resource_config(groups, "algo-1")["hosts"]:
        config = resource_config(groups, host)
        image = build_plan(make_env(resource_config=config, hyperparameters=hps))
        sdk = build_plan(sdk_env(JOB, resource_config=config, hyperparameters=hps))
        assert sdk.topology.worlds == image.topology.worlds, (layout, host)
        assert sdk.topology.world == image.topology.world and sdk.once == image.once, host
        assert sdk.topology.coordinator == image.topology.coordinator
