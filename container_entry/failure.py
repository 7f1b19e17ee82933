"""Outcome files SageMaker reads (<base>/output/success, <base>/output/failure) and the
verdict: one first line a user acts on, an exit code with meaning, full details on disk."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from container_entry.environment import read_shm_bytes
from container_entry.exits import signal_name, stopped_exit_code
from container_entry.hang import HUNG_EXIT_CODE
from container_entry.logs import MASKER, log, redact
from container_entry.plan import run_dir
from container_entry.records import RankRecord
from container_entry.text import escaped, register
from container_entry.worker_defaults import SHM_MIN_BYTES

INTERNAL_EXIT_CODE = 70  # EX_SOFTWARE: a defect of the bootstrap itself, never the user's
# torchrun's argparse: "run.py: error: unrecognized arguments: --x" (usage lines before it)
# argparse's last line when torchrun rejects its command line ("run.py: error: ...")
USAGE_ERROR = re.compile(r"^(?:\S*run\.py|torchrun|\S+): error: (.+)$")


@dataclass
class Observed:
    """What the monitor saw; `verdict` turns it into an exit code and a failure text."""

    torch_version: str | None = None
    returncode: int | None = None  # torchrun's
    results: dict[int, RankRecord] = field(default_factory=dict)
    launched: set[int] = field(default_factory=set)  # ranks whose script was started
    first_failure: RankRecord | None = None  # a local rank that failed on its own
    remote_failure: RankRecord | None = None  # relayed from another host
    hung: RankRecord | None = None  # the hang watchdog's verdict, this host's or the master's
    lost_master: str | None = None  # the master's bootstrap went away
    stop_signal: str | None = None
    stop_at: float | None = None
    torchrun_tail: list[str] = field(default_factory=list)
    forced_kill: bool = False
    grace: float = 0.0  # the grace period that a forced kill ended
    restarts: int = 0  # torchrun's --max-restarts for this launch


def describe_exit(code: int) -> str:
    """'exit code 3' or 'signal SIGKILL' for a negative (killed) return code; a real-time
    signal as 'signal SIGRTMIN+2' (exits.signal_name)."""
    if code < 0:
        return f"signal {signal_name(-code)}"
    return f"exit code {code}"


def container_exit_code(code: int) -> int:
    """A process killed by signal N is reported as 128+N, the shell's convention."""
    return 128 - code if code < 0 else code


_SHM = (
    "shared memory (/dev/shm) too small: run the container with --shm-size=1g (or more) or "
    "--ipc=host"
)
_WATCHDOG = (
    "Watchdog caught collective operation timeout",
    "collective operation timeout",
    "watchdog got stuck",
    "Heartbeat monitor timed out",
    "ProcessGroupNCCL's watchdog",
    "NCCL timeout",
)
_SHM_SIGNS = (
    "failed to extend /dev/shm",  # NCCL's shm transport
    "Error while creating shared memory segment",  # NCCL
    "unable to write to file </torch_",  # torch's shared tensors (DataLoader)
    "insufficient shared memory (shm)",  # DataLoader worker died of SIGBUS
    "out of shared memory",
    "Bus error",
)
_UNNAMED_ENOSPC = re.compile(r"No space left on device(?!: ['\"/])")


def shm_is_small(path: str = "/dev/shm") -> bool:
    """This container's /dev/shm is below the size the plan warns about (docker's 64 MiB)."""
    size = read_shm_bytes(path)
    return size is not None and size < SHM_MIN_BYTES


# (matches(text, exit code), advice), most specific first: a signature in what the rank printed
# wins over what its exit code alone suggests (a watchdog timeout ends in SIGABRT).
_HINTS = (
    (
        lambda text, code: "CUDA out of memory" in text or "OutOfMemoryError" in text,
        "GPU out of memory: lower the per-device batch size",
    ),
    (
        lambda text, code: (
            any(sign in text for sign in _SHM_SIGNS)
            or ("No space left on device" in text and "/dev/shm" in text)
            # a write to an open file names no path: blame /dev/shm when it is docker-small
            or (_UNNAMED_ENOSPC.search(text) is not None and shm_is_small())
            or code in (-7, 135)  # SIGBUS: a page of a full /dev/shm file
        ),
        _SHM,
    ),
    (
        lambda text, code: any(sign in text for sign in _WATCHDOG),
        "a collective timed out: a peer rank hung or died",
    ),
    (
        lambda text, code: code in (-9, 137),
        "killed by SIGKILL: likely out of host memory (OOM killer), or killed externally",
    ),
    (
        lambda text, code: code in (-11, 139) or "Segmentation fault" in text,
        "crashed in native code (segfault): see the rank's log for the Python stacks",
    ),
    (
        lambda text, code: code in (-6, 134),
        "aborted (SIGABRT): often a failed assertion in native code",
    ),
)
_LOG_TAIL_BYTES = 256 * 1024  # of the rank's log, where signatures sit above long stacks


def _log_tail(path: str | None) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - _LOG_TAIL_BYTES))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def hint(record: RankRecord) -> str | None:
    """What the user should look at, where a known symptom appears anywhere in what was kept:
    the exception, faulthandler's line, the stderr tail and the tail of the rank's log (a NCCL
    timeout line sits above C++ frames and every thread's stack, beyond the stderr tail)."""
    text = "\n".join(
        part
        for part in (
            (record.exception or {}).get("message"),
            record.fatal_error,
            *record.stderr_tail,
            _log_tail(record.log),
        )
        if part
    )
    for matches, advice in _HINTS:
        if matches(text, record.returncode):
            return advice
    return None


# Failures that a restart reproduces exactly: the code cannot be compiled, imported or executed,
# or its command line is refused (argparse exits 2). With MAX_RESTARTS > 0 they fail the job at
# once instead of using up every restart; anything else (signals, OOM, NCCL errors, exceptions
# during training) is restarted.
_PERMANENT_TYPES = ("SyntaxError", "IndentationError", "TabError", "ImportError")
_PERMANENT_TYPES += ("ModuleNotFoundError", "ExecError")


def permanent(record: RankRecord) -> str | None:
    """Why restarting would not help, or None."""
    if record.stage == "preflight":
        return "the preflight found a problem of the host, not of the script"
    kind = (record.exception or {}).get("type", "")
    if kind.rsplit(".", 1)[-1] in _PERMANENT_TYPES:
        return f"a {kind.rsplit('.', 1)[-1]} fails the same way on every restart"
    if record.returncode == 2 and not record.exception:
        return "exit code 2 (a usage error) fails the same way on every restart"
    return None


def _names_host(text: str, host: str) -> bool:
    """Whether `text` already names `host` as a word (algo-1 is not named by algo-10)."""
    return re.search(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", text) is not None


def describe_rank(record: RankRecord, restarts_allowed: bool = False) -> str:
    """'rank 3 (local 1) on algo-2: exit code 1: ValueError: planted'."""
    if record.rank is None:  # no rank's failure: the bootstrap's own, or a host that vanished
        what = record.what or describe_exit(record.returncode)
        if record.host is None or _names_host(what, record.host):
            return what  # it says in its own words which host
        return f"{record.host}: {what}"
    text = (
        f"rank {record.rank} (local {record.local_rank}) on {record.host}: "
        f"{describe_exit(record.returncode)}"
    )
    if record.exception:
        text += f": {record.exception['type']}: {record.exception['message']}".rstrip(": ")
    elif record.fatal_error:
        text += f": Fatal Python error: {record.fatal_error}"
    elif record.last_words:
        text += f": {record.last_words}"
    if record.restart_count:  # the group was restarted and failed again: restarts used up
        count = record.restart_count
        text += f" (after {count} restart{'s' if count > 1 else ''})"
    if restarts_allowed and permanent(record):
        text += f" (not restarted: {permanent(record)})"
    advice = hint(record)
    return f"{text} (hint: {advice})" if advice else text


def _frames(block: str) -> list[tuple[str, str]]:
    """(path, 'file.py:LINE in func') per frame of a faulthandler thread block, innermost first."""
    frames = []
    for line in block.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            # File "/opt/ml/code/train.py", line 73 in <module>
            path, _, rest = line[len('File "') :].partition('", line ')
            frames.append((path, f"{path.rsplit('/', 1)[-1]}:{rest}"))
    return frames


def where(stacks: str) -> str | None:
    """Where the main thread was in a faulthandler dump (its block is the last one): the
    innermost frame of the user's code, and the library call it was inside."""
    blocks = [b for b in stacks.strip().split("\n\n") if b.strip()]
    if not blocks:
        return None
    frames = _frames(blocks[-1])
    if not frames:
        return None
    library = ("site-packages", "dist-packages", "/lib/python", "<frozen")
    user = next((text for path, text in frames if not any(m in path for m in library)), None)
    innermost = frames[0][1]
    if user and user != innermost:
        return f"{user}, inside {innermost}"
    return user or innermost


def stack_lines(run_dir: Path) -> list[str]:
    """One line per rank whose stacks were recorded at teardown."""
    lines = []
    for path in sorted((run_dir / "stacks").glob("rank-*.txt")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        frame = where(text)
        if frame:
            lines.append(f"  {path.stem.replace('-', ' ')} was at {frame} ({escaped(str(path))})")
    return lines


@dataclass(frozen=True)
class Verdict:
    exit_code: int
    reason: str  # the failure file's first line; empty on success
    details: list[str]


def _finished_before_stop(run: Observed) -> bool:
    """Every rank had already exited 0 when the stop came (SDK local mode stops the other
    containers as soon as one exits; torchrun may still sit at its exit barrier): a success."""
    ranks = [run.results.get(rank) for rank in run.launched]
    return bool(ranks) and all(
        r is not None
        and not r.failed
        and r.ended_at is not None
        and r.ended_at <= (run.stop_at or 0)
        for r in ranks
    )


def _stopped(run: Observed, host: str) -> str:
    exited = [r for r in run.results.values() if r.ended_at and run.stop_at]
    slowest = max((max(0.0, r.ended_at - run.stop_at) for r in exited if r.ended_at), default=0.0)
    killed = sorted(run.launched - set(run.results))
    total = len(run.launched) or len(exited)
    text = (
        f"job stopped by {run.stop_signal} on {host} (StopTrainingJob, Spot interruption or "
        "docker stop): "
    )
    if killed:
        ranks = ", ".join(map(str, killed))
        were = "were" if len(killed) > 1 else "was"
        if exited:
            text += f"{len(exited)} of {total} local ranks exited within {slowest:.1f} s; "
        text += (
            f"rank{'s' if len(killed) > 1 else ''} {ranks} still running after the "
            f"{run.grace:g} s grace period {were} killed"
        )
    elif run.forced_kill:
        text += f"the {run.grace:g} s grace period ran out and the rest was killed"
    elif not run.launched and not run.results:  # no rank announced itself or left a record
        text += "the stop came before any rank started"
    elif exited and len(exited) == total:
        text += f"all {total} local ranks exited within {slowest:.1f} s"
    else:
        text += f"{len(exited)} of {total} local ranks exited within {slowest:.1f} s"
    return text


def _torchrun_failed(run: Observed, host: str) -> tuple[int, str]:
    """torchrun itself failed before any rank reported: our defect when it rejected the
    command line we built, the tail of what it printed otherwise."""
    assert run.returncode is not None
    for line in reversed(run.torchrun_tail):
        match = USAGE_ERROR.match(line.strip())
        if match:
            return INTERNAL_EXIT_CODE, (
                f"internal error: torchrun (torch {run.torch_version or 'unknown'}) on {host} "
                f"rejected the command line container-entry built: {match.group(1)}"
            )
    # argparse's usage block is noise; torch's own C++ lines ("[E... [c10d] ...") are not
    useful = [
        line.strip()
        for line in run.torchrun_tail
        if line.strip()
        and not line.lstrip().startswith(("usage:", "[-"))
        and line.strip().strip("=-")  # the borders of torchrun's report say nothing
    ]
    tail = " | ".join(useful[-3:])
    return container_exit_code(run.returncode), (
        f"torchrun on {host} failed with {describe_exit(run.returncode)} before any rank "
        f"reported: {tail or 'no output'}"
    )


def words(record: RankRecord, restarts: int = 0) -> str:
    """A failure in the failure file's words: as its own host put them (`summary`, which
    every host of the job then writes alike), else from the record."""
    if record.summary:
        return record.summary
    return f"{_preflight(record)}{describe_rank(record, restarts > 0)}"


def summarized(record: RankRecord, restarts: int = 0) -> RankRecord:
    """The record with its words, before it is posted to the other hosts."""
    return replace(record, summary=record.summary or words(record, restarts))


def _preflight(record: RankRecord) -> str:
    return "preflight failed, the script did not start: " if record.stage == "preflight" else ""


def verdict(run: Observed, host: str, run_dir: Path) -> Verdict:
    """From what the supervisor saw to an exit code and a failure text."""
    logs = f"per-rank logs and records: {escaped(str(run_dir))}"
    failed = sorted((r for r in run.results.values() if r.failed), key=lambda r: r.rank or 0)
    details = [f"  {describe_rank(r)}" for r in failed] + stack_lines(run_dir) + [logs]
    if run.stop_signal:  # what torchrun returned after being ended says nothing here
        if _finished_before_stop(run):
            return Verdict(0, "", [])
        return Verdict(stopped_exit_code(run.stop_signal), _stopped(run, host), details)
    if run.hung is not None:  # first line exactly the verdict; then where each rank was
        return Verdict(HUNG_EXIT_CODE, run.hung.what or "hung", [*stack_lines(run_dir), logs])
    if run.first_failure:
        first = run.first_failure
        return Verdict(
            container_exit_code(first.returncode),
            f"{words(first, run.restarts)} [first failure]",
            details,
        )
    if run.lost_master is not None:
        return Verdict(
            1,
            f"lost contact with the master host {run.lost_master} "
            f"(its bootstrap exited or the host died); {host} stopped",
            details,
        )
    if run.remote_failure is not None:
        remote = run.remote_failure
        return Verdict(
            container_exit_code(remote.returncode or 1),
            f"{words(remote, run.restarts)} [first failure]",
            details,
        )
    if run.returncode:
        code, reason = _torchrun_failed(run, host)
        return Verdict(code, reason, details)
    return Verdict(0, "", [])


class Outcome:
    """Writes the outcome once; keeps a failure file the user's script wrote during this run."""

    def __init__(self, base_dir: Path) -> None:
        self.output = base_dir / "output"
        self.record_path = run_dir(base_dir) / "failure.json"
        self.started = time.time()
        self.written = False

    def _write(self, name: str | Path, text: str) -> None:
        try:
            path = self.output / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(redact(text), encoding="utf-8", errors=register())
        except OSError as error:
            log(f"cannot write {escaped(str(self.output / name))}: {error.strerror}")

    def success(self) -> None:
        self._write("success", "")
        self.written = True

    def failure(
        self, reason: str, details: list[str] | None = None, record: dict[str, Any] | None = None
    ) -> None:
        self.written = True
        path = self.output / "failure"
        try:
            if path.stat().st_mtime >= self.started:
                log(f"keeping the failure file the script wrote: {escaped(str(path))}")
                return
        except OSError:
            pass
        text = "\n".join([reason, *(details or [])])
        self._write("failure", text.rstrip("\n") + "\n")
        if record is not None:  # masked before encoding: JSON escapes would hide a secret
            masked = MASKER.obj(record)
            self._write(self.record_path.relative_to(self.output), json.dumps(masked, indent=1))
