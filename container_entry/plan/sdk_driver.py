"""SageMaker SDK v3's own start (`ModelTrainer(source_code=SourceCode(...))`), read and judged.

With `source_code` the SDK replaces the image's entrypoint: every host runs
`/bin/bash -c "chmod +x <drivers>/sm_train.sh && <drivers>/sm_train.sh"` as PID 1, where
`<drivers>` is the `sm_drivers` input channel it ships: `sm_train.sh` (writes the SM_* variables
with `scripts/environment.py`, sources them, installs `SourceCode.requirements`, then runs one
driver), `sourcecode.json` (SourceCode's fields) and `distributed.json` (`{}`, or Torchrun's /
MPI's fields). Its plain driver runs the script once per host; its torchrun driver has none of
our guarantees. The image's bash hook (docker/sdk-hook.bash) hands that start to
`container-entry sagemaker-sdk` (cli, sdk_start), and `judge` says, from what the SDK left,
whether our launcher takes the job over, the SDK's start runs as it is (`command=`, MPI, the
user opted out), or the layout is not one this release knows (a future SDK): then too the SDK's
start runs as it is, and the line printed says why. Read from sagemaker-train 1.0.0, 1.10.0,
1.20.0 and 1.27.0 (the same layout in all four); run end to end with 1.27.0
(tests/docker/test_sdk_source_code.py).

Pure but for `read_files`, `read_sdk_environment` and `opted_out`, which read what `judge` and
the plan are given.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from container_entry.common.errors import ConfigError
from container_entry.common.text import escaped, json_or_raw

SETTING = "sdk_driver"  # settings.Settings' field: `container-entry` or `sdk`
# the image's BASH_ENV (docker/Dockerfile, which a unit test holds to this): names the hook only
# for a `bash -c` that is PID 1
IMAGE_BASH_ENV = "${BASH_EXECUTION_STRING:+/etc/container-entry/pid$$}"
CHANNEL = "sm_drivers"
TRAIN_SCRIPT = "sm_train.sh"
SOURCE_CODE_JSON = "sourcecode.json"
DISTRIBUTED_JSON = "distributed.json"
ENVIRONMENT_SCRIPT = "scripts/environment.py"
INSTALLER = "scripts/install_requirements.py"  # CodeArtifact-aware pip (sagemaker-train 1.2x)
ENV_FILE = "sm_training.env"  # under <base>/input: what environment.py writes, sm_train.sh sources
DRIVERS = {  # the driver line sm_train.sh runs -> which one
    "distributed_drivers/basic_script_driver.py": "basic",
    "distributed_drivers/torchrun_driver.py": "torchrun",
    "distributed_drivers/mpi_driver.py": "mpi",
}
COMMAND_DRIVER = re.compile(r'^\s*eval "?\$CMD"?\s*$', re.M)  # SourceCode(command=...)


def drop_image_bash_env(environ: MutableMapping[str, str]) -> None:
    """The image's BASH_ENV is for the SDK's start alone: nothing the bootstrap starts (torchrun,
    the ranks, their shells, a command run as given, the SDK's start run as it is) inherits it.
    A BASH_ENV of the user's own is theirs and stays."""
    if environ.get("BASH_ENV") == IMAGE_BASH_ENV:
        del environ["BASH_ENV"]


def drivers_dir(base_dir: Path) -> Path:
    return base_dir / "input" / "data" / CHANNEL


def sdk_start(base_dir: Path) -> str:
    """The `bash -c` string the SDK's ContainerArguments carry (constants.py, 1.0-1.27)."""
    train = drivers_dir(base_dir) / TRAIN_SCRIPT
    return f"chmod +x {train} && {train}"


class Handling(StrEnum):
    TAKE_OVER = "take over"  # container-entry's launcher runs the entry script
    SDK = "sdk"  # the SDK's start runs as it is: command=, MPI, or opted out
    UNRECOGNISED = "unrecognised"  # not the layout this release knows: the SDK's start runs


@dataclass(frozen=True)
class SdkJob:
    """What the SDK would run, for the plan."""

    entry_script: str  # relative to the code folder
    source_dir: bool  # the code is the `code` channel (the SDK cds there); else the cwd
    archive: str | None  # a .tar.gz source_dir, which the SDK extracts in the channel first
    requirements: str | None  # SourceCode.requirements, relative to the code folder
    processes_per_host: int | None  # Torchrun(process_count_per_node=N); None: a GPU each
    distributed: str  # "none" or "torchrun"
    installer: str | None = None  # the SDK's requirements installer, where it shipped one

    def describe(self) -> str:
        torchrun = ""
        if self.distributed == "torchrun":
            count = self.processes_per_host
            torchrun = f", distributed=Torchrun(process_count_per_node={count})"
        return f"SourceCode(entry_script={self.entry_script!r}){torchrun}"


@dataclass(frozen=True)
class Decision:
    verdict: Handling
    why: str  # the one line printed at the job's start
    job: SdkJob | None = None


@dataclass(frozen=True)
class DriverFiles:
    """What the SDK's channel holds (None: the file is missing or unreadable)."""

    train_script: str | None = None
    source_code: str | None = None
    distributed: str | None = None
    environment_script: bool = False
    installer: bool = False


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return None


def read_files(base_dir: Path) -> DriverFiles:
    folder = drivers_dir(base_dir)
    return DriverFiles(
        train_script=_read(folder / TRAIN_SCRIPT),
        source_code=_read(folder / SOURCE_CODE_JSON),
        distributed=_read(folder / DISTRIBUTED_JSON),
        environment_script=(folder / ENVIRONMENT_SCRIPT).is_file(),
        installer=(folder / INSTALLER).is_file(),
    )


def _object(text: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _which_driver(train_script: str) -> str | None:
    """The one driver sm_train.sh runs: basic, torchrun, mpi, command; None: none or several."""
    found = {kind for line, kind in DRIVERS.items() if line in train_script}
    if COMMAND_DRIVER.search(train_script):
        found.add("command")
    return found.pop() if len(found) == 1 else None


def _unrecognised(why: str) -> Decision:
    return Decision(
        Handling.UNRECOGNISED,
        f"SageMaker SDK driver layout not recognised ({why}): the SDK's own start runs, "
        "without container-entry's launcher (no DDP unless the SDK launches it)",
    )


def _job(
    source: dict[str, Any], distributed: dict[str, Any], driver: str, installer: str | None
) -> SdkJob | str:
    """The SDK job, or why its files are not the shape this release knows."""
    entry = source.get("entry_script")
    if not isinstance(entry, str) or not entry.strip() or "\0" in entry:
        return f"{SOURCE_CODE_JSON} has no entry_script"
    source_dir = source.get("source_dir")
    requirements = source.get("requirements")
    if source_dir is not None and not isinstance(source_dir, str):
        return f"{SOURCE_CODE_JSON}: source_dir is not a string"
    if requirements is not None and (not isinstance(requirements, str) or not requirements):
        return f"{SOURCE_CODE_JSON}: requirements is not a file name"
    count = distributed.get("process_count_per_node") if driver == "torchrun" else None
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        return f"{DISTRIBUTED_JSON}: process_count_per_node is not a positive integer"
    if driver != "torchrun" and distributed:
        return f"{TRAIN_SCRIPT} runs the plain driver but {DISTRIBUTED_JSON} is not empty"
    archive = None
    if source_dir and source_dir.endswith(".tar.gz"):
        archive = posixpath.basename(source_dir)
    return SdkJob(
        entry_script=entry,
        source_dir=bool(source_dir),
        archive=archive,
        requirements=requirements,
        processes_per_host=count,
        distributed="torchrun" if driver == "torchrun" else "none",
        installer=installer,
    )


def judge(
    shell_argv: Sequence[str], files: DriverFiles, base_dir: Path, *, opted_out: bool = False
) -> Decision:
    """Whether container-entry takes over the SDK's start `shell_argv` (`bash -c STRING`)."""
    if len(shell_argv) != 3 or shell_argv[1] != "-c":
        return _unrecognised(f"the shell was started as {' '.join(map(escaped, shell_argv))}")
    if shell_argv[2].strip() != sdk_start(base_dir):
        return _unrecognised(f"the shell command is {escaped(shell_argv[2][:200])!r}")
    where = drivers_dir(base_dir)
    if files.train_script is None:
        return _unrecognised(f"{where / TRAIN_SCRIPT} is missing")
    if not files.environment_script:
        return _unrecognised(f"{where / ENVIRONMENT_SCRIPT} is missing")
    env_file = base_dir / "input" / ENV_FILE
    if ENVIRONMENT_SCRIPT not in files.train_script or str(env_file) not in files.train_script:
        return _unrecognised(f"{TRAIN_SCRIPT} does not set its environment as expected")
    driver = _which_driver(files.train_script)
    if driver is None:
        return _unrecognised(f"{TRAIN_SCRIPT} runs no driver this release knows, or several")
    if driver == "command":
        return Decision(
            Handling.SDK,
            "SageMaker SDK v3 SourceCode(command=...): the command runs as the SDK runs it "
            "(no DDP launch of ours; a stop reaches it, docs/sdk-v3.md)",
        )
    if driver == "mpi":
        return Decision(
            Handling.SDK,
            "SageMaker SDK v3 distributed=MPI: the SDK's MPI driver runs it "
            "(container-entry launches torchrun only; a stop reaches it)",
        )
    source, distributed = _object(files.source_code), _object(files.distributed)
    if source is None:
        return _unrecognised(f"{where / SOURCE_CODE_JSON} is missing or not a JSON object")
    if distributed is None:
        return _unrecognised(f"{where / DISTRIBUTED_JSON} is missing or not a JSON object")
    installer = str(where / INSTALLER) if files.installer else None
    job = _job(source, distributed, driver, installer)
    if isinstance(job, str):
        return _unrecognised(job)
    if opted_out:
        return Decision(
            Handling.SDK,
            f"SageMaker SDK v3 {job.describe()}: CONTAINER_ENTRY_SDK_DRIVER=sdk, so the SDK's "
            "own driver runs it (a stop reaches it)",
        )
    return Decision(
        Handling.TAKE_OVER,
        f"SageMaker SDK v3 {job.describe()}: container-entry's launcher runs it, "
        f"{'the given workers' if job.processes_per_host else 'one worker per GPU'} on every "
        "host (CONTAINER_ENTRY_SDK_DRIVER=sdk: the SDK's own driver)",
        job,
    )


def opted_out(environ: Mapping[str, str], hyperparameters: Mapping[str, Any]) -> bool:
    """CONTAINER_ENTRY_SDK_DRIVER (or hyperparameter container_entry_sdk_driver) = sdk. A
    malformed value is not an opt-out: the plan then names it (exit 2)."""
    from container_entry.plan import settings

    raw = environ.get(settings.env_name(SETTING))
    if raw is None:
        raw = hyperparameters.get(settings.HYPERPARAMETER_PREFIX + SETTING)
    return isinstance(raw, str) and raw.strip().lower() == "sdk"


# --- what the SDK's environment.py writes, read back without a shell ---

_ENTRY = re.compile(r"^export (SM_[A-Za-z0-9_]*)='", re.M)


def parse_env_file(text: str) -> dict[str, str]:
    """`export SM_NAME='value'` lines, as environment.py writes them (values unescaped: one
    that holds a quote or a line break spans to the quote that ends its line before the next
    `export`). Only SM_* names are taken: no other variable can be set through a value."""
    starts = list(_ENTRY.finditer(text))
    values: dict[str, str] = {}
    for index, match in enumerate(starts):
        end = starts[index + 1].start() if index + 1 < len(starts) else len(text)
        body = text[match.end() : end]
        if body.endswith("'\n"):
            values[match.group(1)] = body[:-2]
        elif body.endswith("'"):
            values[match.group(1)] = body[:-1]
    return values


def read_sdk_environment(base_dir: Path, python: str, environ: Mapping[str, str]) -> dict[str, str]:
    """Run the SDK's own scripts/environment.py, as sm_train.sh does, and read what it wrote:
    the SM_* variables a script written for the SDK expects. Its printout (every variable,
    weakly masked) is not shown; a failure is one line naming the script."""
    from container_entry.common import offspring

    script = drivers_dir(base_dir) / ENVIRONMENT_SCRIPT
    result = offspring.run(
        [python, str(script)],
        capture_output=True,
        env=dict(environ),
        timeout=300,
    )
    if result.returncode != 0:
        lines = (result.stderr or result.stdout or b"").decode(errors="replace").splitlines()
        last = escaped(lines[-1]) if lines else "no output"
        raise ConfigError(f"{script}: exit code {result.returncode}: {last}")
    path = base_dir / "input" / ENV_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read ({error.strerror})") from None
    return parse_env_file(text)


def script_args(raw: Mapping[str, Any], settings_prefix: str) -> list[str]:
    """The script's arguments as the SDK's drivers render hyperparameters.json: in its order,
    `--key value` for every key (one letter too), the value JSON-decoded then a string as it
    is, anything else as JSON. Our own `container_entry_*` settings are consumed."""
    args: list[str] = []
    for key, value in raw.items():
        if key.startswith(settings_prefix):
            continue
        decoded = json_or_raw(value) if isinstance(value, str) else value
        args += [f"--{key}", decoded if isinstance(decoded, str) else json.dumps(decoded)]
    return args
