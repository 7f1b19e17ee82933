"""A failure in words a user acts on: what a rank died of (its exception, signal or last words),
a hint where the symptom is known, whether a restart would only repeat it, and where each rank
was (its recorded stacks)."""

from __future__ import annotations

import re
from dataclasses import replace

from container_entry.common.exits import signal_name
from container_entry.common.layout import RunDir
from container_entry.common.logs import ours
from container_entry.common.records import RankRecord
from container_entry.common.shm import HINT as _SHM
from container_entry.common.shm import read_bytes as read_shm_bytes
from container_entry.common.shm import too_small
from container_entry.common.text import escaped, names_host


def describe_exit(code: int) -> str:
    """'exit code 3' or 'signal SIGKILL' for a negative (killed) return code; a real-time
    signal as 'signal SIGRTMIN+2' (exits.signal_name)."""
    if code < 0:
        return f"signal {signal_name(-code)}"
    return f"exit code {code}"


_WATCHDOG = (
    "Watchdog caught collective operation timeout",
    "collective operation timeout",
    "watchdog got stuck",
    "Heartbeat monitor timed out",
    "ProcessGroupNCCL's watchdog",
    "NCCL timeout",
    "Timed out waiting",  # gloo: "Timed out waiting 1800000ms for recv operation to complete"
)
TIMEOUT_HINT = "a collective timed out: a peer rank hung or died"
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
    return too_small(read_shm_bytes(path))


# (matches(text, exit code), advice), most specific first: a signature in what the rank printed
# wins over what its exit code alone suggests (a watchdog timeout ends in SIGABRT).
def is_cuda_oom(text: str) -> bool:
    return "CUDA out of memory" in text or "OutOfMemoryError" in text


_HINTS = (
    (
        lambda text, code: is_cuda_oom(text),
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
        TIMEOUT_HINT,
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


def _evidence(record: RankRecord) -> str:
    """Everything kept of how a rank ended, as the script and its libraries printed it: the
    exception, faulthandler's line, the stderr tail and the tail of the rank's log (a NCCL
    timeout line sits above C++ frames and every thread's stack, beyond the stderr tail).
    Never a line of ours (logs.ours): the preflight's /dev/shm warning names the very words a
    hint looks for."""
    log = "\n".join(line for line in _log_tail(record.log).splitlines() if not ours(line))
    return "\n".join(
        part
        for part in (
            (record.exception or {}).get("message"),
            record.fatal_error,
            record.last_words,
            *(line for line in record.stderr_tail if not ours(line)),
            log,
        )
        if part
    )


def hint(record: RankRecord) -> str | None:
    """What the user should look at, where a known symptom appears anywhere in what was kept."""
    text = _evidence(record)
    for matches, advice in _HINTS:
        if matches(text, record.returncode):
            return advice
    return None


def is_collective_timeout(record: RankRecord) -> bool:
    """The rank ended on a collective that timed out (NCCL's watchdog, gloo's wait): the rank
    to blame is the one the others waited for, which the flight records name (culprit.py).
    A record relayed from another host has no logs: its words (`summary`) carry the hint."""
    if TIMEOUT_HINT in (record.summary or ""):
        return True
    text = _evidence(record)
    return any(sign in text for sign in _WATCHDOG)


# Failures that a restart reproduces exactly: the code cannot be compiled, imported or executed,
# or its command line is refused (argparse exits 2). With MAX_RESTARTS > 0 they fail the job at
# once instead of using up every restart; anything else (signals, OOM, NCCL errors, exceptions
# during training) is restarted.
_PERMANENT_TYPES = (
    *("SyntaxError", "IndentationError", "TabError", "ImportError"),
    *("ModuleNotFoundError", "ExecError"),
)


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


def failed_one(record: RankRecord) -> str:
    """What failed, as a short subject: `rank 3`, or the entry point run once on its host."""
    return record.once or f"rank {record.rank}"


def describe_rank(record: RankRecord, restarts_allowed: bool = False) -> str:
    """'rank 3 (local 1) on algo-2: exit code 1: ValueError: planted'."""
    if record.rank is None:  # no rank's failure: the bootstrap's own, or a host that vanished
        what = record.what or describe_exit(record.returncode)
        if record.host is None or names_host(what, record.host):
            return what  # it says in its own words which host
        return f"{record.host}: {what}"
    if record.once:  # the entry point, once on its host: no rank of ours; its launcher's
        text = f"{record.once} on {record.host} (once per host): {describe_exit(record.returncode)}"
        if record.worker:
            text += f": {record.worker}"
    else:
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


def stack_lines(run_dir: RunDir) -> list[str]:
    """One line per rank whose stacks were recorded at teardown."""
    lines = []
    for path in run_dir.stack_files():
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        frame = where(text)
        if frame:
            lines.append(f"  {path.stem.replace('-', ' ')} was at {frame} ({escaped(str(path))})")
    return lines


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


def relayed_words(failure: RankRecord) -> str:
    """A relayed failure as one phrase naming its host, for a host that started no worker."""
    if failure.rank is not None:
        return f"rank {failure.rank} on {failure.host} failed (exit code {failure.returncode})"
    what = failure.what or f"exit code {failure.returncode}"
    named = failure.host is None or names_host(what, failure.host)
    return what if named else f"{failure.host}: {what}"


def vanished_words(host: str, detail: str) -> str:
    """What a host's vanishing looks like from the master. A killed process's socket is closed
    by the kernel: a FIN, or a reset where our heartbeats were still unread in it."""
    if detail in ("closed", "connection reset by peer"):
        how = "closed" if detail == "closed" else "reset"
        return (
            f"host {host} left the job without a word (its side channel was {how}): its "
            "bootstrap was killed or crashed"
        )
    return (
        f"host {host} stopped answering ({detail}): its bootstrap died, froze or lost the network"
    )


def error_words(error: BaseException, relayed: bool = False) -> str:
    """A bootstrap error that ended the job before its ranks could: its type and message, or,
    relayed from another host, the words that host put it in."""
    return str(error) if relayed else f"{type(error).__name__}: {error}"


def stopped_line(words: str) -> str:
    """The first line of a stop that came before our workers ran, or of a start run as it is."""
    return f"StopRequested: {words}"


def unchanged_stop_words(signal: str | None, what: str, waited: float | None) -> str:
    """A stop of a start run as it is (`what`: SDK v3's start, the base's toolkit): before it
    ran (`waited` None), or how long it took to end after the signal."""
    if waited is None:
        return f"stopped by {signal} before {what} ran"
    return f"job stopped by {signal}: {what} ended {waited:.1f} s after it"


def traceback_line(path: str) -> str:
    """Where an internal error's traceback is kept (uploaded with the output)."""
    return f"traceback: {path}"


def internal_words(error: BaseException) -> str:
    """A defect of ours, never the user's, named as such."""
    return f"internal error: {type(error).__name__}: {escaped(str(error))}"


HUNG = "hung:"  # how a hang's verdict begins (hang.is_hang knows it by it)


def hung_words(timeout: float, hosts: int = 1) -> str:
    """A hang's first line in the failure file (its culprit, where found: culprit.explained)."""
    where = " on any host" if hosts > 1 else ""
    return f"{HUNG} no output from any rank{where} for {timeout:g} s"
