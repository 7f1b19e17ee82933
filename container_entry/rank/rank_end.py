"""What a rank's script ended with, for its record: the exception it died of, parsed from what it
printed; faulthandler's fatal error; its last words; an entry script that could not be started,
named; and the record itself saved on a disk that its log may have filled (`save_record`, with
the space `reserve` set aside). Stdlib only: the worker wrapper imports it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path
from typing import Any

from container_entry.common.logs import ours
from container_entry.common.records import write_json
from container_entry.common.text import TRACEBACK, escaped

_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")  # torch.distributed's excepthook adds it
_LOCATION = re.compile(r'^\s*File "(.+)", line (\d+)$')  # a SyntaxError's location line
_SYNTAX = ("SyntaxError", "IndentationError", "TabError")
_LOCATED = re.compile(r"\(.+, line \d+\)$")  # str(SyntaxError) already says where
RESERVE_BYTES = 64 * 1024  # kept free for the rank's record on a disk its log may fill


def parse_exception(stderr_tail: list[str]) -> dict[str, str] | None:
    """The exception the script died of, from what it printed: the last Python traceback, or
    a SyntaxError (which Python prints with no 'Traceback' header) with its file and line."""
    lines = [_RANK_PREFIX.sub("", line) for line in stderr_tail]
    start = None
    for index, line in enumerate(lines):
        if line.startswith(TRACEBACK):
            start = index
    location = None
    if start is None:  # a SyntaxError in the entry script itself: no traceback header
        for index in range(len(lines) - 1, -1, -1):
            if lines[index].startswith(tuple(f"{name}:" for name in _SYNTAX)):
                start = max(-1, index - 6)
                break
        if start is None:
            return None
    for line in lines[start + 1 :]:
        located = _LOCATION.match(line)
        if located:
            location = (os.path.basename(located.group(1)), located.group(2))
        if line.startswith((" ", "\t")) or not line.strip():
            continue  # frames and source lines are indented
        match = _EXCEPTION_LINE.match(line.rstrip())
        if match:
            kind, message = match.group(1), (match.group(2) or "").strip()
            if kind in _SYNTAX and location and not _LOCATED.search(message):
                message = f"{message} ({location[0]}, line {location[1]})"
            return {"type": kind, "message": message}
    return None


def fatal_error(stderr_tail: list[str]) -> str | None:
    """faulthandler's 'Fatal Python error: Segmentation fault' line, if the script crashed."""
    for line in reversed(stderr_tail):
        if line.startswith("Fatal Python error:"):
            return line.split(":", 1)[1].strip()
    return None


def last_words(stderr_tail: list[str]) -> str | None:
    """The last line the script wrote to stderr: `sys.exit("fatal: ...")` and argparse put
    their reason there (never a line of ours, such as the exit teardown's)."""
    for line in reversed(stderr_tail):
        if line.strip() and not ours(line):
            return line.strip()[:500]
    return None


def exec_failure(script: str, error: OSError | ValueError) -> tuple[int, dict[str, str]]:
    """An entry script that could not be started at all: the shell's 126/127 and why."""
    if not isinstance(error, OSError):  # a NUL or an unpaired surrogate in an argument
        reason = f"an argument cannot be passed to a program ({error})"
        return 126, {"type": "ExecError", "message": f"cannot execute {escaped(script)}: {reason}"}
    reason = error.strerror or str(error)
    code = 127 if error.errno == errno.ENOENT else 126
    if error.errno == errno.ENOEXEC:
        reason = "Exec format error: not a program, and no '#!' line naming an interpreter"
    elif error.errno == errno.ENOENT and os.path.exists(script):
        try:
            with open(script, "rb") as handle:
                first = handle.readline(200).decode("utf-8", "replace").strip()
        except OSError:
            first = ""
        interpreter = first[2:].strip() if first.startswith("#!") else "?"
        reason = f"its interpreter {interpreter!r} (the '#!' line) was not found"
    return code, {"type": "ExecError", "message": f"cannot execute {escaped(script)}: {reason}"}


def reserve_space(folder: Path) -> int | None:
    """Space for the record on a disk that the logs may fill: an unlinked file holding
    RESERVE_BYTES (so nothing is left behind, whatever ends this process); closing it gives
    them back. None where it cannot be made (the disk is full already)."""
    path = folder / f".reserve-{os.getpid()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        path.unlink()
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except OSError:
        os.close(fd)
        return None
    return fd


def save_record(path: Path, record: dict[str, Any], reserve: int | None) -> str | None:
    """Write the rank's record; on a full disk give back the reserved space and try again,
    then without the stderr tail. None when written, else why not (the wrapper goes on)."""
    attempts = [record, record, {**record, "stderr_tail": [], "last_words": None}]
    problem = None
    for attempt in attempts:
        try:
            write_json(path, attempt)
            problem = None
            break
        except OSError as error:
            problem = f"rank record {escaped(str(path))} not written: {error.strerror or error}"
            if reserve is not None:
                os.close(reserve)
                reserve = None
    if reserve is not None:
        os.close(reserve)
    return problem
