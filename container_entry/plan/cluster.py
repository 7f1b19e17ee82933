"""Where the hosts come from: one small class per cluster source behind one interface, each
holding every fact about its source.

Each source says whether it applies (`detect`) and, if so, which hosts form the job, which one
this is and who the master is (`topology`); what every host of its job knows alike and no
stranger can read, from which the side channel's key is derived (`key_facts`); the names a host
waits for before it launches (`names_to_wait_for`); and the address a host advertises to a
c10d rendezvous (`local_addr`). Sources are tried in order; the local one always applies. A new
cluster source is one class here, added to SOURCES.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from container_entry.common.errors import ConfigError
from container_entry.plan.environment import Environment
from container_entry.plan.groups import Worlds, form_worlds

# host-independent facts of a SageMaker job a machine in its subnets cannot read
KEY_ENV = ("TRAINING_JOB_NAME", "TRAINING_JOB_ARN")
# a torchrun-style cluster's (no SageMaker files): the same on every node by construction
KEY_ENV_TORCHRUN = (
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_NNODES",
    "PET_RDZV_ID",
    "PET_RDZV_ENDPOINT",
    "MASTER_PORT",
    "WORLD_SIZE",
)


@dataclass(frozen=True)
class Topology:
    source: str  # "sagemaker" | "local"
    hosts: tuple[str, ...]  # every host of the job, sorted: the side channel's members
    current_host: str
    node_rank: int  # in this host's world (0 where it is in none)
    master_addr: str  # this host's world's master; loopback for a world of one host
    network_interface: str | None = None
    instance_type: str | None = None
    instance_groups: tuple[dict[str, Any], ...] = ()
    # host names to wait for before launch, and whether the bootstraps coordinate (they need
    # every host's name); a torchrun-style cluster only names its master
    wait_for: tuple[str, ...] = ()
    coordinated: bool = True
    # the DDP world this host joins, in rank order (empty: none, it runs the script once), every
    # world of the job and why (groups.py), and the host that serves the side channel
    world: tuple[str, ...] = ()
    worlds: Worlds | None = None
    coordinator: str = ""

    @property
    def nnodes(self) -> int:
        """Hosts in this host's world (1 where it is in none)."""
        return max(1, len(self.world))


class SageMakerCluster:
    """SageMaker's resourceconfig.json.

    The hosts form worlds by the DLC's instance-group rule (groups.py): without groups, one
    world of the sorted hosts, master the first, node rank the index (loopback on a single
    host); with several, never one world across groups. Every host of the job, whatever its
    world, takes part in one side channel. torchrun's static rendezvous accepts a different
    worker count per host, so 8-GPU and 4-GPU hosts of one world contribute 8 and 4 workers.
    """

    name: ClassVar[str] = "sagemaker"

    @staticmethod
    def detect(env: Environment) -> bool:
        return env.resource_config is not None

    @staticmethod
    def topology(env: Environment) -> Topology:
        config = env.resource_config or {}
        where = env.config_dir / "resourceconfig.json"
        current = config.get("current_host")
        if not isinstance(current, str) or not current:
            raise ConfigError(f"{where}: 'current_host' is missing or not a string")
        groups = config.get("instance_groups") or []
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            raise ConfigError(f"{where}: 'instance_groups' must be a list of objects")
        group_hosts = [h for g in groups for h in (g.get("hosts") or [])]
        hosts = config.get("hosts", group_hosts)
        if (
            not isinstance(hosts, list)
            or not hosts
            or not all(isinstance(h, str) and h for h in hosts)
        ):
            raise ConfigError(f"{where}: 'hosts' must be a non-empty list of host names")
        unknown = sorted(set(group_hosts) - set(hosts))
        if unknown:
            raise ConfigError(f"{where}: instance_groups name hosts not in 'hosts': {unknown}")
        ordered = tuple(sorted(set(hosts)))
        if current not in ordered:
            raise ConfigError(f"{where}: current_host {current!r} is not in hosts {list(ordered)}")
        interface = config.get("network_interface_name")
        worlds = form_worlds(ordered, groups, env.hyperparameters, str(where))
        world = worlds.of(current)
        return Topology(
            source=SageMakerCluster.name,
            hosts=ordered,
            current_host=current,
            node_rank=world.index(current) if world else 0,
            # a world of one host: the rendezvous never leaves it, so no DNS is needed at all
            master_addr=world[0] if len(world) > 1 else "127.0.0.1",
            network_interface=interface if isinstance(interface, str) and interface else None,
            instance_type=config.get("current_instance_type"),
            instance_groups=tuple(groups),
            wait_for=world if len(world) > 1 else (),
            world=world,
            worlds=worlds,
            coordinator=worlds.coordinator,
        )

    @staticmethod
    def key_facts(env: Environment) -> dict[str, Any]:
        """What SageMaker gives every host of the job alike and a machine in the job's subnets
        cannot read: the host list and instance groups of resourceconfig.json (not its
        host-specific fields), hyperparameters.json, inputdataconfig.json, the job's name and
        ARN (not the credentials URI: nothing says it is the same on every host, and a fact that
        differs between hosts would refuse every host of every multi-host job)."""
        config = env.resource_config or {}
        groups = config.get("instance_groups") or []
        instance_groups = [
            [
                str(g.get("instance_group_name")),
                str(g.get("instance_type")),
                sorted(str(h) for h in g.get("hosts") or []),
            ]
            for g in groups
            if isinstance(g, Mapping)
        ]
        return {
            "hosts": sorted(str(h) for h in config.get("hosts") or []),
            "instance_groups": sorted(instance_groups, key=json.dumps),
            "hyperparameters": env.hyperparameters,
            "input_data_config": env.input_data_config,
            "environ": {name: env.environ.get(name) for name in KEY_ENV},
        }

    @staticmethod
    def names_to_wait_for(
        topology: Topology, *, c10d: bool, store: str | None, side_channel: str | None
    ) -> tuple[str, ...]:
        """Under the static rendezvous every worker dials only its world's store (`store`, the
        master's name where this host is not it) and the side channel is the coordinator's: a
        host waits for those names alone (the coordinator looks up the names of the hosts that
        have not joined yet): no host resolves every name. Under c10d (restarts) each host
        advertises its own name: every host of its world."""
        names = topology.wait_for if c10d else (store,) if store else ()
        return tuple(dict.fromkeys((*names, *([side_channel] if side_channel else []))))

    @staticmethod
    def local_addr(topology: Topology) -> str | None:
        """The address a c10d rendezvous advertises for this host: its real name, which every
        host resolves (loopback where its world is itself)."""
        return "127.0.0.1" if topology.nnodes == 1 else topology.current_host


class TorchrunEnvCluster:
    """Settings torchrun-style clusters already carry (Kubeflow PyTorchJob's PET_*, or the
    MASTER_ADDR / WORLD_SIZE / RANK of older operators, where they count pods), so the same
    image runs on Kubernetes. Peers are not named: hosts are node-<rank>, only the master is
    waited for, and failure relay between hosts is left to torchrun's rendezvous.
    """

    name: ClassVar[str] = "torchrun-env"

    @staticmethod
    def detect(env: Environment) -> bool:
        e = env.environ
        return env.resource_config is None and (
            "PET_NNODES" in e
            or "PET_MASTER_ADDR" in e
            or ("MASTER_ADDR" in e and "WORLD_SIZE" in e)
        )

    @staticmethod
    def topology(env: Environment) -> Topology:
        e = env.environ
        nnodes_raw = e.get("PET_NNODES") or e.get("WORLD_SIZE") or "1"
        rank_raw = e.get("PET_NODE_RANK") or e.get("RANK") or "0"
        master = e.get("PET_MASTER_ADDR") or e.get("MASTER_ADDR") or "127.0.0.1"
        try:
            nnodes = int(nnodes_raw.split(":")[-1])  # elastic "1:4" -> at most 4
            rank = int(rank_raw)
        except ValueError:
            raise ConfigError(
                f"torchrun-style environment: nnodes {nnodes_raw!r} / node rank {rank_raw!r} "
                "are not integers"
            ) from None
        if not 0 <= rank < nnodes:
            raise ConfigError(f"torchrun-style environment: node rank {rank} not in [0, {nnodes})")
        hosts = tuple(f"node-{i}" for i in range(nnodes))
        return Topology(
            source=TorchrunEnvCluster.name,
            hosts=hosts,
            current_host=hosts[rank],
            node_rank=rank,
            master_addr=master,
            wait_for=(master,) if nnodes > 1 else (),
            coordinated=False,
            world=hosts,
            coordinator=hosts[0],
        )

    @staticmethod
    def key_facts(env: Environment) -> dict[str, Any]:
        """The rendezvous variables, the same on every node by construction."""
        return {"torchrun": {name: env.environ.get(name) for name in KEY_ENV_TORCHRUN}}

    @staticmethod
    def names_to_wait_for(
        topology: Topology, *, c10d: bool, store: str | None, side_channel: str | None
    ) -> tuple[str, ...]:
        """Its master alone: the peers are not named."""
        return topology.wait_for

    @staticmethod
    def local_addr(topology: Topology) -> str | None:
        """Host names unknown: torch's own default, the host's FQDN (loopback for one node)."""
        return "127.0.0.1" if topology.nnodes == 1 else None


class LocalCluster:
    """A plain `docker run`: one host, this one; the rendezvous stays on loopback."""

    name: ClassVar[str] = "local"

    @staticmethod
    def detect(env: Environment) -> bool:
        return True

    @staticmethod
    def topology(env: Environment) -> Topology:
        return Topology(
            source=LocalCluster.name,
            hosts=(env.hostname,),
            current_host=env.hostname,
            node_rank=0,
            master_addr="127.0.0.1",
            world=(env.hostname,),
            coordinator=env.hostname,
        )

    @staticmethod
    def key_facts(env: Environment) -> dict[str, Any]:
        """One host: no side channel, nothing to key."""
        return {}

    @staticmethod
    def names_to_wait_for(
        topology: Topology, *, c10d: bool, store: str | None, side_channel: str | None
    ) -> tuple[str, ...]:
        return ()

    @staticmethod
    def local_addr(topology: Topology) -> str | None:
        return "127.0.0.1"


Source = type[SageMakerCluster] | type[TorchrunEnvCluster] | type[LocalCluster]
SOURCES: Sequence[Source] = (
    SageMakerCluster,
    TorchrunEnvCluster,
    LocalCluster,
)


def source_for(env: Environment) -> Source:
    """The first source that detects itself."""
    return next(source for source in SOURCES if source.detect(env))  # LocalCluster always does


def source_of(topology: Topology) -> Source:
    """The source a topology came from."""
    return next(source for source in SOURCES if source.name == topology.source)


def resolve_topology(env: Environment) -> Topology:
    """The topology of the first source that detects itself."""
    return source_for(env).topology(env)


def key_facts(env: Environment) -> dict[str, Any]:
    """What every host of this job knows alike, for the side channel's key (hosts.keys)."""
    return source_for(env).key_facts(env)
