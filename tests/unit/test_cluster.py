import pytest

from container_entry.common.errors import ConfigError
from container_entry.plan.cluster import resolve_topology
from tests.unit.conftest import make_env

HETERO = {
    "current_host": "algo-3",
    "current_instance_type": "ml.g5.12xlarge",
    "current_group_name": "workers",
    "hosts": ["algo-1", "algo-2", "algo-3", "algo-4"],
    "instance_groups": [
        {
            "instance_group_name": "workers",
            "instance_type": "ml.g5.12xlarge",
            "hosts": ["algo-4", "algo-3"],
        },
        {
            "instance_group_name": "leaders",
            "instance_type": "ml.p4d.24xlarge",
            "hosts": ["algo-2", "algo-1"],
        },
    ],
    "network_interface_name": "eth1",
}


@pytest.mark.parametrize(
    ("config", "hosts", "rank", "master", "iface"),
    [
        ({"current_host": "algo-1", "hosts": ["algo-1"]}, ("algo-1",), 0, "127.0.0.1", None),
        (
            {
                "current_host": "algo-2",
                "hosts": ["algo-3", "algo-1", "algo-2"],
                "network_interface_name": "eth0",
            },
            ("algo-1", "algo-2", "algo-3"),
            1,
            "algo-1",
            "eth0",
        ),
        # each instance group its own world (no group key): algo-3 is rank 1 of workers'
        (HETERO, ("algo-1", "algo-2", "algo-3", "algo-4"), 1, "algo-4", "eth1"),
        # optional fields missing: no hosts list, only groups; no interface name
        (
            {
                "current_host": "algo-2",
                "instance_groups": [{"instance_group_name": "g", "hosts": ["algo-2", "algo-1"]}],
            },
            ("algo-1", "algo-2"),
            1,
            "algo-1",
            None,
        ),
    ],
    ids=["one-host", "three-hosts", "heterogeneous-unsorted-groups", "optional-fields-missing"],
)
def test_sagemaker_topology(config, hosts, rank, master, iface):
    topology = resolve_topology(make_env(resource_config=config))
    assert topology.source == "sagemaker"
    assert (topology.hosts, topology.node_rank, topology.master_addr) == (hosts, rank, master)
    assert topology.network_interface == iface


def test_every_host_of_a_heterogeneous_cluster_agrees_on_ranks():
    """Without a group key each instance group is a world of its own, its hosts in the file's
    order; one side channel for the job, served by the first largest world's master."""
    ranks = {}
    for host in HETERO["hosts"]:
        topology = resolve_topology(make_env(resource_config={**HETERO, "current_host": host}))
        ranks[host] = (topology.world, topology.node_rank, topology.master_addr)
        assert topology.coordinator == "algo-4" and topology.hosts == tuple(HETERO["hosts"])
    assert ranks == {
        "algo-1": (("algo-2", "algo-1"), 1, "algo-2"),
        "algo-2": (("algo-2", "algo-1"), 0, "algo-2"),
        "algo-3": (("algo-4", "algo-3"), 1, "algo-4"),
        "algo-4": (("algo-4", "algo-3"), 0, "algo-4"),
    }


def test_local_mode_without_resourceconfig():
    topology = resolve_topology(make_env(resource_config=None))
    assert topology.source == "local"
    assert topology.hosts == ("container-abc",)
    assert (topology.node_rank, topology.master_addr) == (0, "127.0.0.1")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"hosts": ["algo-1"]}, "'current_host' is missing"),
        ({"current_host": "algo-9", "hosts": ["algo-1", "algo-2"]}, "current_host 'algo-9' is not"),
        ({"current_host": "algo-1", "hosts": []}, "non-empty list"),
        ({"current_host": "algo-1", "hosts": "algo-1"}, "non-empty list"),
        (
            {
                "current_host": "algo-1",
                "hosts": ["algo-1"],
                "instance_groups": [{"hosts": ["algo-7"]}],
            },
            "not in 'hosts'",
        ),
    ],
)
def test_bad_resourceconfig_names_the_file(config, message):
    with pytest.raises(ConfigError, match=message) as error:
        resolve_topology(make_env(resource_config=config))
    assert "resourceconfig.json" in str(error.value)


def test_torchrun_style_environment_without_sagemaker_files():
    environ = {"PET_NNODES": "3", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "job-master-0"}
    topology = resolve_topology(make_env(resource_config=None, environ=environ))
    assert topology.source == "torchrun-env"
    assert (topology.hosts, topology.node_rank) == (("node-0", "node-1", "node-2"), 2)
    assert topology.master_addr == "job-master-0" and topology.wait_for == ("job-master-0",)
    assert not topology.coordinated


def test_kubeflow_v1_master_addr_world_size_counts_pods():
    environ = {"MASTER_ADDR": "pt-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}
    topology = resolve_topology(make_env(resource_config=None, environ=environ))
    assert (topology.source, topology.node_rank, len(topology.hosts)) == ("torchrun-env", 1, 2)


def test_sagemaker_files_win_over_torchrun_environment():
    environ = {"PET_NNODES": "3", "PET_NODE_RANK": "2"}
    assert resolve_topology(make_env(environ=environ)).source == "sagemaker"


def test_bad_torchrun_environment_is_one_clear_error():
    with pytest.raises(ConfigError, match="node rank 5 not in"):
        resolve_topology(
            make_env(resource_config=None, environ={"PET_NNODES": "2", "PET_NODE_RANK": "5"})
        )
