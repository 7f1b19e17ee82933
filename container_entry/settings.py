"""The bootstrap's own knobs: one prefix, as env vars and as hyperparameters.

`CONTAINER_ENTRY_<NAME>` in the environment, or hyperparameter `container_entry_<name>`; the
environment wins because it is the more deliberate of the two (set in the image or the job's
Environment map). Hyperparameters with the prefix are consumed, never passed to the script.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from container_entry.errors import ConfigError

ENV_PREFIX = "CONTAINER_ENTRY_"
HYPERPARAMETER_PREFIX = "container_entry_"


@dataclass(frozen=True)
class Knob:
    name: str  # lower-case, without prefix
    default: Any
    parse: Callable[[str], Any]
    help: str


def _port(value: str) -> int:
    port = int(value)
    if not 1 <= port <= 65535:
        raise ValueError("not a TCP port")
    return port


def _positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError("must be > 0")
    return number


def _non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be >= 0")
    return number


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("not a boolean")


def _preflight(value: str) -> str:
    value = value.strip().lower()
    if value in ("auto", "true", "false", "1", "0", "yes", "no"):
        return {"1": "true", "yes": "true", "0": "false", "no": "false"}.get(value, value)
    raise ValueError("auto, true or false")


def _ranks(value: str) -> str:
    value = value.strip().lower()
    if value == "all" or all(item.strip().isdigit() for item in value.split(",")):
        return value
    raise ValueError("'all' or comma-separated global ranks")


KNOBS: tuple[Knob, ...] = (
    Knob("master_port", 29500, _port, "TCP port of the rendezvous on the master host"),
    Knob(
        "host_wait_timeout",
        900.0,
        _positive_float,
        "seconds to wait for every peer host name to resolve before failing",
    ),
    Knob("max_restarts", 0, _non_negative_int, "torchrun --max-restarts for the worker group"),
    Knob(
        "install_requirements",
        True,
        _bool,
        "pip install requirements.txt from the code directory before launch",
    ),
    Knob(
        "join_timeout",
        600.0,
        _positive_float,
        "seconds for every host to join the job before any worker starts",
    ),
    Knob(
        "stop_grace_period",
        100.0,
        _positive_float,
        "seconds ranks get after SIGTERM before SIGKILL (SageMaker kills at 120 s)",
    ),
    Knob(
        "failure_grace_period",
        5.0,
        _positive_float,
        "seconds ranks get to exit once a rank on any host failed, before SIGKILL",
    ),
    Knob("console_ranks", "all", _ranks, "ranks whose lines reach stdout: 'all' or e.g. '0'"),
    Knob(
        "dry_run",
        False,
        _bool,
        "`train` prints the plan as JSON and exits, launching nothing (`plan` inside SageMaker)",
    ),
    Knob(
        "preflight",
        "auto",
        _preflight,
        "cluster check before the script: auto (multi-host only), true, false",
    ),
)


def resolve(environ: Mapping[str, str], hyperparameter_knobs: Mapping[str, Any]) -> dict[str, Any]:
    """Every knob's value: env, then hyperparameter, then default. Unknown names are errors."""
    known = {knob.name: knob for knob in KNOBS}
    for name in hyperparameter_knobs:
        if name not in known:
            raise ConfigError(
                f"unknown hyperparameter {HYPERPARAMETER_PREFIX}{name} "
                f"(known: {', '.join(HYPERPARAMETER_PREFIX + k for k in sorted(known))})"
            )
    for name in environ:
        if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX) :].lower() not in known:
            raise ConfigError(
                f"unknown environment variable {name} "
                f"(known: {', '.join(ENV_PREFIX + k.upper() for k in sorted(known))})"
            )
    values: dict[str, Any] = {}
    for knob in KNOBS:
        env_name = ENV_PREFIX + knob.name.upper()
        if env_name in environ:
            origin, raw = env_name, environ[env_name]
        elif knob.name in hyperparameter_knobs:
            origin, raw = HYPERPARAMETER_PREFIX + knob.name, hyperparameter_knobs[knob.name]
        else:
            values[knob.name] = knob.default
            continue
        try:
            values[knob.name] = knob.parse(str(raw).strip())
        except ValueError as error:
            raise ConfigError(f"{origin}={raw!r}: {error}") from None
    return values
