"""Hyperparameters: decode every encoding that reaches a container, split off reserved keys,
render `--key value` arguments the way the incumbent does so existing scripts parse them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from container_entry.errors import ConfigError
from container_entry.settings import HYPERPARAMETER_PREFIX

SAGEMAKER_PREFIX = "sagemaker_"


def decode(raw: Any) -> Any:
    """Decode one value.

    SDK v2 framework estimators JSON-encode each value ('"bert"', '3', 'true'); the generic
    Estimator sends str() ('True'); SDK v3 and raw API callers send plain strings. JSON first,
    the raw string when it is not JSON: the same rule as sagemaker-training.
    """
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


@dataclass(frozen=True)
class Hyperparameters:
    user: dict[str, Any]  # what the script receives, decoded
    sagemaker: dict[str, Any]  # sagemaker_* keys: consumed by the bootstrap
    knobs: dict[str, Any]  # container_entry_* keys: the bootstrap's own settings


def split(raw: Mapping[str, Any]) -> Hyperparameters:
    """Decode all values and separate the reserved keys from the user's."""
    user: dict[str, Any] = {}
    sagemaker: dict[str, Any] = {}
    knobs: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"hyperparameters.json: invalid key {key!r}")
        decoded = decode(value)
        if key.startswith(SAGEMAKER_PREFIX):
            sagemaker[key] = decoded
        elif key.startswith(HYPERPARAMETER_PREFIX):
            knobs[key[len(HYPERPARAMETER_PREFIX) :]] = decoded
        else:
            user[key] = decoded
    return Hyperparameters(user, sagemaker, knobs)


def to_args(user: Mapping[str, Any]) -> list[str]:
    """Render sorted `--key value` (`-k value` for one-letter keys), as sagemaker-training does.

    Reuses sagemaker-training's own renderer (its `mapping` module has no import-time effects)
    so a script that worked under the incumbent receives byte-identical arguments.
    """
    from sagemaker_training import mapping

    return [str(item) for item in mapping.to_cmd_args(dict(user))]
