"""The records that cross process and host boundaries, typed once (where each lives:
layout.py). Stdlib only (the worker wrapper uses them).

- `RankRecord`: written by each rank's worker wrapper when its script ends (`rank-N.json` in the
  run folder), read by the launcher's monitor, relayed to the other hosts when it is the first
  failure, and turned into the failure file's lines.
- `Command`: what every worker wrapper of a launch runs (`command.json` in the control folder).
- `WorkerPids`: a running rank's processes, as its wrapper announces them (`rank-N.pid`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from container_entry.common.stopping import StopSignal

# What a rank's exception says when a peer's end broke its connection: its failure is the
# consequence of the peer's. gloo closes a pair in C++ when its collective times out, before
# that rank's Python prints its traceback, so the victim's traceback could start first (8 ms,
# run 31 of docs/test-speed.md).
PEER_GONE = (
    "Connection closed by peer",  # gloo
    "Connection reset by peer",
    "remote process exited or there was a network error",  # NCCL's ncclRemoteError
    "ncclRemoteError",
)
PEER_LAG = 1.0  # seconds by which a consequence may be seen before its cause


def began(failed_at: Any, ended_at: Any, exception: Any = None) -> Any:
    """When a failure began, the job's rule for which came first: the start of the rank's last
    traceback (failed_at), else its end (ended_at); a failure whose exception says a peer's
    connection broke counts PEER_LAG later, so a failure of any other kind that began within
    that lag after it comes first. Records and relayed failures alike."""
    at = failed_at if failed_at is not None else ended_at
    if isinstance(at, int | float) and isinstance(exception, dict):
        message = str(exception.get("message") or "")
        if any(words in message for words in PEER_GONE):
            return at + PEER_LAG
    return at


@dataclass(frozen=True)
class RankRecord:
    host: str | None
    rank: int | None  # None: not a rank's failure (the bootstrap's own, before any launch)
    local_rank: int | None = None
    returncode: int = 0
    restart_count: int = 0
    signal: str | None = None
    exception: dict[str, str] | None = None  # {"type", "message"}
    fatal_error: str | None = None  # faulthandler's "Fatal Python error: ..." line
    last_words: str | None = None  # the last stderr line of a failed script
    # a stop the rank's wrapper saw before the script ended, as it came (its signal, when); a
    # host's stop, as its bootstrap relays it (no rank: `host_stopped`)
    stop: StopSignal | None = None
    started_at: float | None = None
    # when the failure began, as its wrapper saw it: the start of the script's last traceback,
    # else of its exit teardown (both come before the rank's sockets close, so a peer's error
    # about them begins later even when that peer exits first); None: neither, see ended_at
    failed_at: float | None = None
    # when the script itself ended (main returned, sys.exit, an uncaught exception), which a
    # Python script notes as its exit begins; else when its process was gone. A stop after it
    # ended nothing of the script's
    script_ended_at: float | None = None
    ended_at: float | None = None
    stderr_tail: list[str] = field(default_factory=list)
    log: str | None = None
    what: str | None = None  # a failure that is no rank's: what happened, in words
    stage: str | None = None  # "preflight": the preflight failed, the script never started
    # the failure file's words for it, as its own host put them (with what only that host's
    # rank log shows): every host writes the job's first failure in these same words
    summary: str | None = None
    log_error: str | None = None  # the rank log stopped (a full disk): where and why
    console_error: str | None = None  # the console stopped taking this rank's lines: why
    # the entry point ran once on its host (it launches its own workers): its name, and which
    # of its workers failed as its launcher's own report says (launcher_report.py)
    once: str | None = None
    worker: str | None = None

    @property
    def failed(self) -> bool:
        return bool(self.returncode)

    @property
    def failed_on_its_own(self) -> bool:
        """Failed, and not as a stop's consequence: no stop reached it, or its failure began
        (its traceback, its exit teardown) before the stop did and it still exited with a
        status of its own. A rank that exits with an error closes its sockets in its exit
        teardown, its peers fail on them at once, and the launcher's stop then reaches it
        still exiting (the teardown holds the stop off). One that the stop ended by its
        signal meanwhile has no status of its own to report: another rank names the failure."""
        if not self.failed:
            return False
        if self.stop is None:
            return True
        return self.returncode > 0 and self.failed_at is not None and self.failed_at < self.stop.at

    @property
    def host_stopped(self) -> bool:
        """A host's stop as its bootstrap relays it (no rank's record: a rank's stop is the
        stop its wrapper saw)."""
        return self.rank is None and self.stop is not None

    @property
    def began(self) -> float | None:
        return began(self.failed_at, self.ended_at, self.exception)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def relayed(self) -> dict[str, Any]:
        """What another host needs to name this failure (no logs, no tail)."""
        data = self.to_json()
        local = ("stderr_tail", "log", "started_at")
        for name in (*local, "log_error", "console_error"):
            data.pop(name)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if "stop" in values:
            values["stop"] = StopSignal.from_json(values["stop"])
        return cls(**values)


@dataclass(frozen=True)
class Command:
    """What each worker wrapper runs: the script's command line (never through torchrun's
    parser), the preflight before it, where its logs and records go, which ranks show on the
    console, the secrets to mask, and the console to write to."""

    argv: tuple[str, ...]
    run_dir: str
    preflight: tuple[str, ...] = ()
    console_ranks: tuple[int, ...] | None = None  # shown on the console; None: all
    secrets: tuple[str, ...] = ()
    console_stderr: str | None = None  # the bootstrap's stderr as a worker can open it
    group_teardown_seconds: float = 0.0  # GROUP_TEARDOWN_TIMEOUT: the script's exit; 0: off
    # a script with no '#!' line runs under /bin/sh, as execvp and the shell do it (SDK v3's
    # drivers start a .sh entry script through /bin/sh); else it is an ExecError naming the line
    sh_fallback: bool = False
    # the entry point runs once on this host, as the DLC runs it (it launches its own workers):
    # in this environment (the SageMaker contract; none of torchrun's per-rank variables, which
    # would steer the user's own launcher), its lines tagged with the host alone; None: a rank
    once_env: dict[str, str] | None = None

    def write(self, path: Path) -> None:
        """Readable by this user only: the command line holds the hyperparameters."""
        data = dataclasses.asdict(self)
        path.write_text(json.dumps(data, ensure_ascii=True), encoding="ascii")
        path.chmod(0o600)

    @classmethod
    def read(cls, path: Path) -> Command:
        """Raises OSError or ValueError (not there, not this record)."""
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("argv"), list):
            raise ValueError(f"{path}: not a command")
        if "run_dir" not in data:
            raise ValueError(f"{path}: no run_dir")
        try:
            return cls(
                argv=tuple(map(str, data["argv"])),
                run_dir=str(data["run_dir"]),
                preflight=tuple(map(str, data.get("preflight") or ())),
                console_ranks=_ranks(data.get("console_ranks")),
                secrets=tuple(map(str, data.get("secrets") or ())),
                console_stderr=data.get("console_stderr"),
                group_teardown_seconds=float(data.get("group_teardown_seconds") or 0.0),
                sh_fallback=bool(data.get("sh_fallback")),
                once_env=_environment(data.get("once_env")),
            )
        except TypeError as error:  # a field of the wrong kind (a number for a list)
            raise ValueError(f"{path}: not a command ({error})") from None

    def shows(self, rank: int) -> bool:
        """Whether this rank's lines reach the console (CONSOLE_RANKS); its log has them all."""
        return self.console_ranks is None or rank in self.console_ranks


def console_ranks(value: str) -> str:
    """CONSOLE_RANKS checked and normalised (`all`, or comma-separated global ranks): the
    setting's parser (settings.py), here beside the record that carries it to the ranks."""
    lowered = value.strip().lower().replace(" ", "")
    if lowered == "all" or (lowered and all(item.isdigit() for item in lowered.split(","))):
        return lowered
    raise ValueError("'all' or comma-separated global ranks")


def shown_ranks(spec: str) -> tuple[int, ...] | None:
    """The global ranks a CONSOLE_RANKS value shows on the console; None: all."""
    value = console_ranks(spec)
    return None if value == "all" else tuple(sorted({int(item) for item in value.split(",")}))


def _environment(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError("once_env is not an object")
    return {str(k): str(v) for k, v in value.items()}


def _ranks(value: Any) -> tuple[int, ...] | None:
    """The ranks shown on the console; None: all. The setting's own text (`all`, `0,2`), as a
    launcher that does not parse it writes it, is parsed here."""
    if value is None:
        return None
    if isinstance(value, str):
        return shown_ranks(value)
    return tuple(int(rank) for rank in value)


@dataclass(frozen=True)
class WorkerPids:
    """A running rank's processes: its wrapper (the leader of the rank's process group, which
    holds the script too) and the script's own process."""

    rank: int
    wrapper: int
    child: int
    host: str = ""
    local_rank: int = 0

    def write(self, path: Path) -> None:
        write_json(path, dataclasses.asdict(self))

    @classmethod
    def read(cls, path: Path) -> WorkerPids | None:
        data = read_json(path)
        if data is None:
            return None
        try:
            return cls(
                rank=int(data["rank"]),
                wrapper=int(data["wrapper"]),
                child=int(data["child"]),
                host=str(data.get("host", "")),
                local_rank=int(data.get("local_rank", 0)),
            )
        except (TypeError, KeyError, ValueError):
            return None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: a reader never sees half a record. ASCII JSON (a name that is not UTF-8 is an
    escape in it, never an encoding error); a write that fails (a full disk) leaves nothing
    behind and raises OSError."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(data, indent=1, ensure_ascii=True), encoding="ascii")
        temporary.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
