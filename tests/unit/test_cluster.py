import pytest

from container_entry.cluster import resolve_topology
from container_entry.errors import ConfigError
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
        (HETERO, ("algo-1", "algo-2", "algo-3", "algo-4"), 2, "algo-1", "eth1"),
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
    ranks = {}
    for host in HETERO["hosts"]:
        topology = resolve_topology(make_env(resource_config={**HETERO, "current_host": host}))
        ranks[host] = (topology.node_rank, topology.master_addr)
    assert ranks == {
        "algo-1": (0, "algo-1"),
        "algo-2": (1, "algo-1"),
        "algo-3": (2, "algo-1"),
        "algo-4": (3, "algo-1"),
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
