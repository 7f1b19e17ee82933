"""Hyperparameters: decode every encoding that reaches a container, split off reserved keys,
render `--key value` arguments the way the incumbent does so existing scripts parse them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from container_entry.common.errors import ConfigError
from container_entry.common.text import json_or_raw
from container_entry.plan.settings import HYPERPARAMETER_PREFIX

SAGEMAKER_PREFIX = "sagemaker_"
SOURCE = "hyperparameters.json"


def reserved_keys() -> frozenset[str]:
    """The keys sagemaker-training consumes itself (`_tuning_objective_metric`, which every
    tuning job adds, among them), from sagemaker-training's own list: the incumbent never passes
    them to the script. Its `params` module has no import-time effects."""
    from sagemaker_training import params

    return frozenset(params.SAGEMAKER_HYPERPARAMETERS)


def decode(raw: Any) -> Any:
    """Decode one value.

    SDK v2 framework estimators JSON-encode each value ('"bert"', '3', 'true'); the generic
    Estimator sends str() ('True'); SDK v3 and raw API callers send plain strings. JSON first,
    the raw string when it is not JSON: the same rule as sagemaker-training (text.json_or_raw).
    """
    return json_or_raw(raw) if isinstance(raw, str) else raw


@dataclass(frozen=True)
class Hyperparameters:
    user: dict[str, Any]  # what the script receives, decoded
    sagemaker: dict[str, Any]  # sagemaker_* and reserved keys: consumed, never passed on
    settings: dict[str, Any]  # container_entry_* keys: the bootstrap's own settings


def unusable(text: str) -> str | None:
    """Why a string cannot be an argument or an environment entry of a process, if it cannot."""
    if "\0" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    return None


def split(raw: Mapping[str, Any]) -> Hyperparameters:
    """Decode all values and separate the reserved keys from the user's."""
    reserved = reserved_keys()
    user: dict[str, Any] = {}
    sagemaker: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for key, value in raw.items():
        problem = "is empty" if not key else unusable(key)
        if problem is None and "=" in key:
            problem = "contains '=' (it cannot become the variable SM_HP_<NAME>)"
        if problem:
            raise ConfigError(f"{SOURCE}: hyperparameter name {key!r} {problem}")
        decoded = decode(value)
        # a string value is passed raw (SM_HP_<NAME>, argv); nested ones arrive JSON-escaped
        problem = unusable(decoded) if isinstance(decoded, str) else None
        if problem:
            raise ConfigError(f"{SOURCE}: the value of hyperparameter {key!r} {problem}")
        if key.startswith(SAGEMAKER_PREFIX) or key in reserved:
            sagemaker[key] = decoded
        elif key.startswith(HYPERPARAMETER_PREFIX):
            settings[key[len(HYPERPARAMETER_PREFIX) :]] = decoded
        else:
            user[key] = decoded
    return Hyperparameters(user, sagemaker, settings)


def to_args(user: Mapping[str, Any]) -> list[str]:
    """Render sorted `--key value` (`-k value` for one-letter keys), as sagemaker-training does.

    Reuses sagemaker-training's own renderer (its `mapping` module has no import-time effects)
    so a script that worked under the incumbent receives byte-identical arguments. A value no
    process could receive is an error naming the hyperparameter.
    """
    from sagemaker_training import mapping

    args = [str(item) for item in mapping.to_cmd_args(dict(user))]
    for key, value in zip(sorted(user), args[1::2], strict=True):
        problem = unusable(value)
        if problem:
            raise ConfigError(f"{SOURCE}: the value of hyperparameter {key!r} {problem}")
    return args
