"""Outcome files SageMaker reads (<base>/output/success, <base>/output/failure) and the
verdict: one first line a user acts on, an exit code with meaning, full details on disk."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from container_entry.logs import log, redact

if TYPE_CHECKING:  # launch's Run is only read here; no import cycle at run time
    from container_entry.launch import Run

# SageMaker shows this many characters of the failure file as the job's FailureReason.
FAILURE_REASON_LIMIT = 1024
STOPPED_EXIT_CODE = 128 + signal.SIGTERM  # 143


def describe_exit(code: int) -> str:
    """'exit code 3' or 'signal SIGKILL' for a negative (killed) return code."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def container_exit_code(code: int) -> int:
    """A process killed by signal N is reported as 128+N, the shell's convention."""
    return 128 - code if code < 0 else code


def hint(record: dict[str, Any]) -> str | None:
    """What the user should look at, where the symptom says it."""
    code = record.get("returncode") or 0
    text = " ".join(
        str(part)
        for part in (
            (record.get("exception") or {}).get("message"),
            record.get("fatal_error"),
            *(record.get("stderr_tail") or [])[-10:],
        )
        if part
    )
    if "Watchdog caught collective operation timeout" in text or (
        "NCCL" in text and "timeout" in text.lower()
    ):
        return "a collective timed out: a peer rank hung or died"
    if code in (-9, 137):
        return "killed by SIGKILL: likely out of host memory (OOM killer), or killed externally"
    if code in (-11, 139) or "Segmentation fault" in text:
        return "crashed in native code (segfault): see the rank's log for the Python stacks"
    if "CUDA out of memory" in text or "OutOfMemoryError" in text:
        return "GPU out of memory: lower the per-device batch size"
    if code in (-6, 134):
        return "aborted (SIGABRT): often a failed assertion in native code"
    return None


def describe_rank(record: dict[str, Any]) -> str:
    """'rank 3 (local 1) on algo-2: exit code 1: ValueError: planted'."""
    code = int(record.get("returncode") or 0)
    text = (
        f"rank {record.get('rank')} (local {record.get('local_rank')}) on "
        f"{record.get('host')}: {describe_exit(code)}"
    )
    exception = record.get("exception")
    if exception:
        text += f": {exception['type']}: {exception['message']}".rstrip(": ")
    elif record.get("fatal_error"):
        text += f": Fatal Python error: {record['fatal_error']}"
    restarts = int(record.get("restart_count") or 0)
    if restarts:  # the group was restarted and failed again: every restart is used up
        text += f" (after {restarts} restart{'s' if restarts > 1 else ''})"
    advice = hint(record)
    return f"{text} (hint: {advice})" if advice else text


def _frames(block: str) -> list[str]:
    """'file.py:LINE in func' for each frame of a faulthandler thread block, innermost first."""
    frames = []
    for line in block.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            # File "/opt/ml/code/train.py", line 73 in <module>
            path, _, rest = line[len('File "') :].partition('", line ')
            frames.append((path, f"{path.rsplit('/', 1)[-1]}:{rest}"))
    return [f"{path}\0{text}" for path, text in frames]


def where(stacks: str) -> str | None:
    """Where the main thread was in a faulthandler dump (its block is the last one): the
    innermost frame of the user's code, and the library call it was inside."""
    blocks = [b for b in stacks.strip().split("\n\n") if b.strip()]
    if not blocks:
        return None
    frames = [f.split("\0") for f in _frames(blocks[-1])]
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
            lines.append(f"  {path.stem.replace('-', ' ')} was at {frame} ({path})")
    return lines


@dataclass(frozen=True)
class Verdict:
    exit_code: int
    reason: str  # the failure file's first line; empty on success
    details: list[str]


def verdict(run: Run, host: str, run_dir: Path) -> Verdict:
    """From what the supervisor saw to an exit code and a failure text."""
    logs = f"per-rank logs and records: {run_dir}"
    failed = sorted(
        (r for r in run.results.values() if r.get("returncode")), key=lambda r: r["rank"]
    )
    details = [f"  {describe_rank(r)}" for r in failed] + stack_lines(run_dir) + [logs]
    if run.stop_signal:
        exited = [r for r in run.results.values() if r.get("ended_at") and run.stop_at]
        slowest = max((r["ended_at"] - run.stop_at for r in exited), default=0.0)
        forced = " ; grace period exceeded, the rest was killed" if run.forced_kill else ""
        return Verdict(
            STOPPED_EXIT_CODE,
            f"job stopped by {run.stop_signal} on {host} (StopTrainingJob, Spot interruption or "
            f"docker stop): {len(exited)} local ranks exited within {slowest:.1f} s{forced}",
            details,
        )
    if run.first_failure:
        first = run.first_failure
        return Verdict(
            container_exit_code(int(first["returncode"])),
            f"{describe_rank(first)} [first failure, seen on {host}]",
            details,
        )
    if run.remote_failure is not None:
        remote = run.remote_failure
        if "lost_master" in remote:
            return Verdict(
                1,
                f"lost contact with the master host {remote['lost_master']} "
                f"(its bootstrap exited or the host died); {host} stopped",
                details,
            )
        return Verdict(
            container_exit_code(int(remote.get("returncode") or 1)),
            f"{describe_rank(remote)} [first failure; {host} stopped because of it]",
            details,
        )
    if run.returncode:
        tail = " | ".join(line.strip() for line in run.torchrun_tail[-3:] if line.strip())
        return Verdict(
            container_exit_code(run.returncode),
            f"torchrun on {host} failed with {describe_exit(run.returncode)} before "
            f"any rank reported: {tail or 'no output'}",
            details,
        )
    return Verdict(0, "", [])


class Outcome:
    """Writes the outcome once; keeps a failure file the user's script wrote during this run."""

    def __init__(self, base_dir: Path) -> None:
        self.output = base_dir / "output"
        self.started = time.time()

    def _write(self, name: str, text: str) -> None:
        try:
            self.output.mkdir(parents=True, exist_ok=True)
            (self.output / name).write_text(text, encoding="utf-8")
        except OSError as error:
            log(f"cannot write {self.output / name}: {error.strerror}")

    def success(self) -> None:
        self._write("success", "")

    def failure(
        self, reason: str, details: list[str] | None = None, record: dict[str, Any] | None = None
    ) -> None:
        path = self.output / "failure"
        try:
            if path.stat().st_mtime >= self.started:
                log(f"keeping the failure file the script wrote: {path}")
                return
        except OSError:
            pass
        text = "\n".join([reason, *(details or [])])
        self._write("failure", redact(text).rstrip("\n") + "\n")
        if record is not None:
            self._write("data/container-entry/failure.json", json.dumps(record, indent=1))
