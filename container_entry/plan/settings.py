"""The bootstrap's own settings: one typed, frozen record, parsed and validated once.

Each setting is `CONTAINER_ENTRY_<NAME>` in the environment or hyperparameter
`container_entry_<name>`; the environment wins because it is the more deliberate of the two (set
in the image or the job's Environment map). Hyperparameters with the prefix are consumed, never
passed to the script. `SETTINGS` is the single table: the README's settings table and
`container-entry --help` are generated from it (tests/unit/test_settings.py checks the README).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from container_entry.common.errors import ConfigError
from container_entry.common.records import console_ranks

ENV_PREFIX = "CONTAINER_ENTRY_"
HYPERPARAMETER_PREFIX = "container_entry_"
# what the bootstrap exports to the workers under the prefix: a script that starts a nested
# container-entry hands it on, which is not a misspelt setting; and the side channel's secret
# (hosts.JOB_SECRET_ENV), a credential kept out of the printed settings
NOT_SETTINGS = frozenset({"CONTAINER_ENTRY_PROGRESS_FILE", "CONTAINER_ENTRY_JOB_SECRET"})


def _port(value: str) -> int:
    port = int(value)
    if not 1 <= port <= 65534:  # the side channel uses port + 1
        raise ValueError("not a TCP port below 65535")
    return port


def _seconds(value: str) -> float:
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError("must be a finite number of seconds > 0")
    return number


def _seconds_or_off(value: str) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError("must be a finite number of seconds >= 0 (0: off)")
    return number


MIN_STRAGGLER_INTERVAL = 1.0  # a sample asks every rank for a dump: never a busy loop of them


def _interval(value: str) -> float:
    """STRAGGLER_INTERVAL: 0 (off) or at least MIN_STRAGGLER_INTERVAL seconds."""
    number = _seconds_or_off(value)
    if 0 < number < MIN_STRAGGLER_INTERVAL:
        raise ValueError(f"must be 0 (off) or at least {MIN_STRAGGLER_INTERVAL:g} second")
    return number


def _seconds_off_or_auto(value: str) -> float | None:
    """HANG_TIMEOUT: `auto` (None: decided from the job's own output, hang.Silence) or seconds."""
    if value.strip().lower() == "auto":
        return None
    return _seconds_or_off(value)


def _count(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be an integer >= 0")
    return number


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("not a boolean (true or false)")


def _preflight(value: str) -> str:
    lowered = value.strip().lower()
    aliases = {
        "1": "true",
        "yes": "true",
        "on": "true",
        "0": "false",
        "no": "false",
        "off": "false",
    }
    lowered = aliases.get(lowered, lowered)
    if lowered in ("auto", "true", "false"):
        return lowered
    raise ValueError("auto, true or false")


def _launch(value: str) -> str:
    lowered = value.strip().lower()
    aliases = {"once-per-host": "once", "per-host": "once", "workers": "ddp", "torchrun": "ddp"}
    lowered = aliases.get(lowered, lowered)
    if lowered in ("auto", "ddp", "once"):
        return lowered
    raise ValueError("auto, ddp or once")


def _sdk_driver(value: str) -> str:
    lowered = value.strip().lower()
    if lowered in ("container-entry", "sdk"):
        return lowered
    raise ValueError("container-entry or sdk")


def _setting(default: Any, parse: Callable[[str], Any], doc: str) -> Any:
    return dataclasses.field(default=default, metadata={"parse": parse, "doc": doc})


@dataclass(frozen=True)
class Settings:
    master_port: int = _setting(
        29500, _port, "rendezvous TCP port on the master host (the side channel uses +1)"
    )
    host_wait_timeout: float = _setting(
        900.0, _seconds, "seconds to wait for every peer host name to resolve"
    )
    join_timeout: float = _setting(
        600.0, _seconds, "seconds for every host to join the job before any worker starts"
    )
    max_restarts: int = _setting(
        0,
        _count,
        "torchrun `--max-restarts`: a failed worker group restarts on every host (resume "
        "from `SM_CHECKPOINT_DIR`); see docs/restarts.md",
    )
    stop_grace_period: float = _setting(
        100.0, _seconds, "seconds ranks get after SIGTERM before SIGKILL (SageMaker kills at 120 s)"
    )
    failure_grace_period: float = _setting(
        5.0, _seconds, "seconds ranks get to exit once a rank on any host failed"
    )
    hang_timeout: float | None = _setting(
        None,
        _seconds_off_or_auto,
        "seconds with no output line and no progress report from any rank on any host before "
        "the job is declared hung: stacks recorded, every host stopped, exit 124; `0`: off; "
        "`auto`: multi-host jobs, max(30 min, 3 x the longest silence the job came back from), "
        "once every host printed",
    )
    straggler_interval: float = _setting(
        180.0,
        _interval,
        "seconds between samples of every rank's collective records, from which the master "
        "names a rank or host that is consistently the last to arrive (the first sample one "
        "interval after the start); `0`: off; see docs/stragglers.md",
    )
    console_ranks: str = _setting(
        "all", console_ranks, "ranks whose lines reach stdout: `all` or e.g. `0`"
    )
    group_teardown_timeout: float = _setting(
        10.0,
        _seconds_or_off,
        "seconds a rank's exit waits for its process groups' teardown (`destroy_process_group`, "
        "which HF Trainer scripts leave to exit, where torch may abort); `0`: off",
    )
    install_requirements: bool = _setting(
        True, _bool, "pip install `requirements.txt` from the code directory"
    )
    preflight: str = _setting(
        "auto",
        _preflight,
        "cluster check before the script: `auto` (multi-host jobs), `true`, `false`",
    )
    launch: str = _setting(
        "auto",
        _launch,
        "how each host runs the entry point: `auto` (one DDP worker per GPU, unless the entry "
        "point launches its own workers, its instance group is outside the distribution groups "
        "or `distribution=` asks for another launcher), `ddp` (our workers even so) or `once` "
        "(once per host, as the DLC runs it); see docs/launch-modes.md",
    )
    sdk_driver: str = _setting(
        "container-entry",
        _sdk_driver,
        "SageMaker SDK v3 `ModelTrainer(source_code=...)` with `entry_script`: "
        "`container-entry` (our launcher runs it, one worker per GPU on every host) or `sdk` "
        "(the SDK's own driver, as without this image); see docs/sdk-v3.md",
    )
    dry_run: bool = _setting(
        False,
        _bool,
        "`train` prints the plan as JSON and exits (the `plan` command inside SageMaker)",
    )


SETTINGS: tuple[dataclasses.Field, ...] = dataclasses.fields(Settings)


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def table() -> list[tuple[str, str, str]]:
    """(NAME, default, meaning) per setting, for the README and --help."""
    rows = []
    for field in SETTINGS:
        default = field.default
        shown = (
            str(default).lower()
            if isinstance(default, bool)
            else f"{default:g}"
            if isinstance(default, float)
            else "auto"
            if default is None
            else str(default)
        )
        rows.append((field.name.upper(), shown, field.metadata["doc"]))
    return rows


def resolve(environ: Mapping[str, str], hyperparameters: Mapping[str, Any]) -> Settings:
    """Every setting: env, then hyperparameter, then default. Unknown names are errors."""
    known = {field.name for field in SETTINGS}
    for name in hyperparameters:
        if name not in known:
            raise ConfigError(
                f"unknown hyperparameter {HYPERPARAMETER_PREFIX}{name} "
                f"(known: {', '.join(HYPERPARAMETER_PREFIX + k for k in sorted(known))})"
            )
    for name in environ:
        if name in NOT_SETTINGS:
            continue
        if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX) :].lower() not in known:
            raise ConfigError(
                f"unknown environment variable {name} "
                f"(known: {', '.join(env_name(k) for k in sorted(known))})"
            )
    values: dict[str, Any] = {}
    for field in SETTINGS:
        if env_name(field.name) in environ:
            origin, raw = env_name(field.name), environ[env_name(field.name)]
        elif field.name in hyperparameters:
            origin, raw = HYPERPARAMETER_PREFIX + field.name, hyperparameters[field.name]
        else:
            continue
        text = str(raw).lower() if isinstance(raw, bool) else str(raw)
        try:
            values[field.name] = field.metadata["parse"](text.strip())
        except ValueError as error:
            raise ConfigError(f"{origin}={raw!r}: {error}") from None
    return Settings(**values)
