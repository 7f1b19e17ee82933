"""The job key and the proofs of the side channel's handshake.

Every host derives the same key from facts of its job that a machine in the job's subnets
cannot read (or from CONTAINER_ENTRY_JOB_SECRET); the key never crosses the network: each end
proves it holds it with an HMAC over both ends' challenges and what it says. hashlib and hmac
are imported where used: OpenSSL (5 MB) is loaded only in a job of several hosts."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from container_entry.common.errors import ConfigError

JOB_SECRET_ENV = "CONTAINER_ENTRY_JOB_SECRET"
MIN_SECRET_LENGTH = 16
# host-independent facts of a SageMaker job a machine in its subnets cannot read (with the
# config files' contents). Not the credentials URI: nothing says it is the same on every host,
# and a fact that differs between hosts would refuse every host of every multi-host job.
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
# what a host refused for its proof (or refusing the master's) is told to check
KEY_ADVICE = (
    f"every host must derive the same job key: the same job and config files, and "
    f"{JOB_SECRET_ENV} set to the same value on every host or on none"
)


def job_key(
    environ: Mapping[str, str],
    resource_config: Mapping[str, Any] | None,
    hyperparameters: Mapping[str, Any],
    input_data_config: Mapping[str, Any],
) -> bytes:
    """The side channel's key, the same on every host of one job (pure).

    CONTAINER_ENTRY_JOB_SECRET, when set, is the key (at least MIN_SECRET_LENGTH characters).
    Otherwise a digest of what SageMaker gives every host of the job alike and a machine in the
    job's subnets cannot read: the host list and instance groups of resourceconfig.json (not
    its host-specific fields), hyperparameters.json, inputdataconfig.json, the job's name and
    ARN, and the container-credentials URI where set. Outside SageMaker: the torchrun
    variables (PET_*, MASTER_PORT, WORLD_SIZE). Raises ConfigError for a short secret."""
    import hashlib

    secret = environ.get(JOB_SECRET_ENV)
    if secret is not None:
        if len(secret) < MIN_SECRET_LENGTH:
            raise ConfigError(
                f"{JOB_SECRET_ENV} is {len(secret)} characters: use at least "
                f"{MIN_SECRET_LENGTH} (the same random value on every host)"
            )
        return hashlib.sha256(b"container-entry job secret v1\0" + secret.encode()).digest()
    facts: dict[str, Any]
    if resource_config is not None:
        facts = {
            **_sagemaker_facts(resource_config),
            "hyperparameters": hyperparameters,
            "input_data_config": input_data_config,
            "environ": {name: environ.get(name) for name in KEY_ENV},
        }
    else:
        facts = {"torchrun": {name: environ.get(name) for name in KEY_ENV_TORCHRUN}}
    canonical = json.dumps(facts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(b"container-entry job key v1\0" + canonical.encode()).digest()


def _sagemaker_facts(resource_config: Mapping[str, Any]) -> dict[str, Any]:
    """resourceconfig.json's host list and instance groups, in an order every host shares."""
    groups = resource_config.get("instance_groups") or []
    return {
        "hosts": sorted(str(h) for h in resource_config.get("hosts") or []),
        "instance_groups": sorted(
            (
                [
                    str(g.get("instance_group_name")),
                    str(g.get("instance_type")),
                    sorted(str(h) for h in g.get("hosts") or []),
                ]
                for g in groups
                if isinstance(g, Mapping)
            ),
            key=json.dumps,
        ),
    }


def _mac(key: bytes, *parts: object) -> str:
    import hashlib
    import hmac

    text = "\0".join(["container-entry side channel v1", *(str(p) for p in parts)])
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def join_proof(
    key: bytes, nonce: str, member_nonce: str, host: str, machine: str | None, workers: int
) -> str:
    """A member's proof that it holds the key, bound to the master's challenge and its join."""
    return _mac(key, "join", nonce, member_nonce, host, machine or "", workers)


def welcome_proof(key: bytes, member_nonce: str, nonce: str, host: str) -> str:
    """The master's proof to the member that it holds the key too."""
    return _mac(key, "welcome", member_nonce, nonce, host)


def same(expected: str, given: str) -> bool:
    """Whether a proof is the expected one, in constant time."""
    import hmac

    return hmac.compare_digest(expected, given)


def new_nonce() -> str:
    """A fresh challenge: 64 hex digits (as secrets.token_hex, without importing random)."""
    return os.urandom(32).hex()
