"""Which hosts train together: SageMaker's instance groups, read by the rule of the DLC's toolkit.

A job may have several instance groups (`instance_groups` in resourceconfig.json; the documented
use is a CPU group doing data work beside a GPU group that trains). The DLC never makes one
world across groups. Let D be the groups named by the hyperparameter
`sagemaker_distribution_instance_groups` (SDK v2 writes it for MPI and smdistributed data
parallel); without it, D is the host's own group when a launcher flag (`sagemaker_*_enabled`)
is set (sagemaker-training 5.1.4, environment.py: `distribution_instance_groups`,
`distribution_hosts`, `master_hostname`). A host in D launches over the hosts of D, in the file's
order (master the first, node rank the index); every other host runs the script once.

Ours differs only where the DLC forms no world and we train with DDP by default: without the
key, each instance group is its own world (never one across groups), and a job with one group
or none is one world of the sorted host list, as before groups existed. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from container_entry.common.errors import ConfigError
from container_entry.common.text import json_or_raw

GROUPS_KEY = "sagemaker_distribution_instance_groups"
# the flags by which the toolkit puts a host's own group in D (environment.py,
# get_distribution_instance_groups_from_resource_config)
LAUNCHER_FLAGS = (
    "sagemaker_mpi_enabled",
    "sagemaker_parameter_server_enabled",
    "sagemaker_distributed_dataparallel_enabled",
    "sagemaker_pytorch_ddp_enabled",
    "sagemaker_pytorch_xla_multi_worker_enabled",
    "sagemaker_multi_worker_mirrored_strategy_enabled",
    "sagemaker_torch_distributed_enabled",
)
HOMOGENEOUS = "homogeneousCluster"  # the toolkit's name for a job without groups


def decoded(value: Any) -> Any:
    """A hyperparameter as the toolkit reads it: JSON where it is JSON."""
    return json_or_raw(value) if isinstance(value, str) else value


def launcher_flag(hyperparameters: Mapping[str, Any]) -> str | None:
    """The first launcher flag the job set (truthy, as the toolkit tests it), if any."""
    return next((k for k in LAUNCHER_FLAGS if decoded(hyperparameters.get(k, False))), None)


@dataclass(frozen=True)
class Worlds:
    """How the job's hosts train: the DDP worlds (each its hosts in rank order) and the hosts in
    no world, which run the script once each, with the reason."""

    worlds: tuple[tuple[str, ...], ...]
    once: tuple[str, ...]
    why: str

    def of(self, host: str) -> tuple[str, ...]:
        """The world `host` joins; empty: none, it runs the script once."""
        return next((world for world in self.worlds if host in world), ())

    @property
    def coordinator(self) -> str:
        """The host that serves the job's side channel (one for all worlds): the master of the
        largest world, the first such in the file's order (where the job trains longest, the
        hosts of a smaller world may leave first); without a world, the first host."""
        if self.worlds:
            return max(self.worlds, key=len)[0]
        return min(self.once)


def _group_names(
    groups: Sequence[Mapping[str, Any]], hosts: Sequence[str], where: str
) -> list[tuple[str, list[str]]]:
    """(name, hosts in the file's order) per group, each checked."""
    named: list[tuple[str, list[str]]] = []
    seen: dict[str, str] = {}
    for group in groups:
        name, members = group.get("instance_group_name"), group.get("hosts") or []
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: an instance group has no 'instance_group_name'")
        if not isinstance(members, list) or not all(isinstance(h, str) for h in members):
            raise ConfigError(f"{where}: instance group {name!r}: 'hosts' must be a list of names")
        if any(existing == name for existing, _ in named):
            raise ConfigError(f"{where}: instance group {name!r} is listed twice")
        for host in members:
            if host in seen:
                raise ConfigError(
                    f"{where}: host {host!r} is in two instance groups ({seen[host]!r}, {name!r})"
                )
            seen[host] = name
        named.append((name, list(members)))
    missing = sorted(set(hosts) - set(seen))
    if named and missing:
        raise ConfigError(f"{where}: hosts {missing} are in no instance group")
    return named


def _distribution_groups(
    hyperparameters: Mapping[str, Any], names: Sequence[str]
) -> list[str] | None:
    """D as the job names it (the hyperparameter), checked; None when the job names none."""
    if GROUPS_KEY not in hyperparameters:
        return None
    value = decoded(hyperparameters[GROUPS_KEY])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"hyperparameter {GROUPS_KEY}={hyperparameters[GROUPS_KEY]!r}: "
            "a JSON list of instance group names"
        )
    unknown = sorted(set(value) - set(names))
    if names and unknown:
        raise ConfigError(
            f"hyperparameter {GROUPS_KEY} names instance groups this job does not have: "
            f"{unknown} (its groups: {list(names)})"
        )
    return value


def form_worlds(
    hosts: Sequence[str],
    groups: Sequence[Mapping[str, Any]],
    hyperparameters: Mapping[str, Any],
    where: str,
) -> Worlds:
    """The job's worlds from its sorted host list, its instance groups (the file's order) and its
    raw hyperparameters; raises ConfigError for groups that contradict each other or the key. A
    file without groups is one group of every host, named as the toolkit names it."""
    named = _group_names(groups, hosts, where) or [(HOMOGENEOUS, list(hosts))]
    names = [name for name, _ in named]
    wanted = _distribution_groups(hyperparameters, names)
    if wanted is not None:
        world = tuple(dict.fromkeys(h for n, members in named if n in wanted for h in members))
        once = tuple(sorted(set(hosts) - set(world)))
        if not world:
            why = f"{GROUPS_KEY}={wanted}: no world, every host runs the script once"
            return Worlds((), once, why)
        why = f"{GROUPS_KEY}={wanted}: one world of their hosts (the file's order)"
        if once:
            why += "; the other groups' hosts run the script once each"
        return Worlds((world,), once, why)
    if len(named) > 1:
        worlds = tuple(tuple(members) for _, members in named if members)
        why = (
            f"{len(named)} instance groups and no {GROUPS_KEY}: each group is a world of its own "
            "(its hosts in the file's order), never one across groups"
        )
        return Worlds(worlds, (), why)
    flag = launcher_flag(hyperparameters)
    if groups and flag:
        why = f"{flag}: one world of instance group {names[0]!r} (its hosts in the file's order)"
        return Worlds((tuple(named[0][1]),), (), why)
    why = "one world of every host (sorted)" if len(hosts) > 1 else "one host"
    return Worlds((tuple(hosts),), (), why)


def _member(name: Any, groups: Any) -> bool:
    """`name in groups` as the toolkit tests it (a string value tests for a substring); a value
    the test cannot apply to (the toolkit would raise) holds no group."""
    try:
        return bool(name in groups)
    except TypeError:
        return False


def toolkit_distribution(
    resource_config: Mapping[str, Any], framework: Mapping[str, Any]
) -> tuple[Any, list[Any]]:
    """`distribution_instance_groups` and `distribution_hosts` as sagemaker-training computes
    them on this host (`framework`: the decoded sagemaker_* hyperparameters): D from the key,
    else this host's group where a launcher flag is set, else none; the hosts of D's groups in
    the file's order, every host where the file has no groups."""
    configured = [g for g in resource_config.get("instance_groups") or [] if isinstance(g, dict)]
    current = resource_config.get("current_group_name", HOMOGENEOUS)
    if GROUPS_KEY in framework:
        groups = framework[GROUPS_KEY]
    elif any(framework.get(flag, False) for flag in LAUNCHER_FLAGS):
        groups = [current]
    else:
        groups = []
    if not configured:
        return groups, list(resource_config.get("hosts") or [])
    hosts = [
        host
        for group in configured
        if _member(group.get("instance_group_name"), groups)
        for host in group.get("hosts") or []
    ]
    return groups, hosts


def toolkit_master(resource_config: Mapping[str, Any], framework: Mapping[str, Any]) -> Any:
    """`master_hostname` as sagemaker-training computes it: the first distribution host, else
    the first host as the file lists them. What the DLC exports as MASTER_ADDR to a script it
    runs, and SM_TRAINING_ENV's `master_hostname` wherever we form no world of our own."""
    hosts = resource_config.get("hosts") or [resource_config.get("current_host")]
    return next(iter(toolkit_distribution(resource_config, framework)[1] or hosts))
