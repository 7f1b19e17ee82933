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
# what a host refused for its proof (or refusing the master's) is told to check
KEY_ADVICE = (
    f"every host must derive the same job key: the same job and config files, and "
    f"{JOB_SECRET_ENV} set to the same value on every host or on none"
)


def job_key(environ: Mapping[str, str], facts: Mapping[str, Any]) -> bytes:
    """The side channel's key, the same on every host of one job (pure).

    CONTAINER_ENTRY_JOB_SECRET, when set, is the key (at least MIN_SECRET_LENGTH characters).
    Otherwise a digest of `facts`: what the job's cluster source gives every host of the job
    alike and a machine in the job's subnets cannot read (plan.cluster, `key_facts`). Raises
    ConfigError for a short secret."""
    import hashlib

    secret = environ.get(JOB_SECRET_ENV)
    if secret is not None:
        if len(secret) < MIN_SECRET_LENGTH:
            raise ConfigError(
                f"{JOB_SECRET_ENV} is {len(secret)} characters: use at least "
                f"{MIN_SECRET_LENGTH} (the same random value on every host)"
            )
        return hashlib.sha256(b"container-entry job secret v1\0" + secret.encode()).digest()
    canonical = json.dumps(facts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(b"container-entry job key v1\0" + canonical.encode()).digest()


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
