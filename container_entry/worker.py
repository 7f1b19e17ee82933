"""Per-rank wrapper that torchrun starts instead of the user's script (`-m container_entry.worker`).

What it adds that torchrun's own `--log-dir/--tee/--local-ranks-filter` cannot:
- the script's command line arrives in a private file, never on torchrun's command line, where
  argparse would take `--log`, `--node`, ... for abbreviations of torchrun's options;
- every line tagged with host and rank and forwarded live (at once after a quiet spell, within
  COALESCE_SECONDS in a burst), registered secrets masked in it, on the console (filtered by
  CONSOLE_RANKS; stderr straight to the container's, not through torchrun) and in a per-rank
  log, from one thread (`relay`);
- console lines that stay whole: every rank of a host writes to the same pipe, and a line
  longer than PIPE_BUF would be cut by another rank's bytes, so each batch is written under an
  flock of that pipe (`Console`, `console_lock`);
- the relay never ends training: a rank log that cannot be written (a full disk) stops, and so
  does a console nobody reads (EPIPE, EIO), each once, said on the other one and in the record;
  the record itself has space set aside (`save_record`);
- a result record (exit status, signal (`SIGRTMIN+2` too: exits.signal_name), the exception
  type and message parsed from what the script printed, an exec failure named) that the
  bootstrap turns into a failure file;
- stacks on demand (SIGUSR2, through _site/sitecustomize.py in the script's own Python).
Stdlib only: it starts in milliseconds. What it writes of its own is valid UTF-8 whatever the
names (text.ESCAPE); what the script printed goes on byte for byte.

Stop signals: the bootstrap signals each worker's process group, which holds this wrapper and the
script alike, so the wrapper does not forward them (that would deliver them twice); it records
that a stop was requested, waits for the script to finish and then exits 0 whatever the script's
status (kept in the record): torchrun must see no failed worker during a stop, or it would
signal the other ranks again, kill them 30 s later (before torch 2.12) or restart the group. A
wrapper that torchrun starts after the stop (the bootstrap's STOP_FILE exists) runs nothing. A
stop is noted from the wrapper's first line on (a SIGINT while it still imports is no
KeyboardInterrupt, a SIGTERM then does not kill it).
"""

from __future__ import annotations

import signal
import time

if __name__ == "__main__":  # the rank's wrapper: a stop is noted from its first line on
    _EARLY: dict[int, float] = {}
    for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(_sig, lambda signum, _: _EARLY.setdefault(signum, time.time()))

import collections
import contextlib
import errno
import fcntl
import json
import os
import re
import select
import selectors
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from container_entry import flight_recorder
from container_entry.exits import signal_name, signal_number
from container_entry.hang import report_progress
from container_entry.masking import Masker
from container_entry.records import RankRecord, write_json
from container_entry.stopping import STOP_SIGNALS
from container_entry.text import encoded, escaped

CONTROL_ENV = "_CONTAINER_ENTRY_CONTROL"  # the launcher's private folder: command.json, pids
STACKS_ENV = "_CONTAINER_ENTRY_STACKS"  # read by _site/sitecustomize.py in the script's Python
SITE_DIR = str(Path(__file__).resolve().parent / "_site")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")  # torch.distributed's excepthook adds it
_LOCATION = re.compile(r'^\s*File "(.+)", line (\d+)$')  # a SyntaxError's location line
_SYNTAX = ("SyntaxError", "IndentationError", "TabError")
_LOCATED = re.compile(r"\(.+, line \d+\)$")  # str(SyntaxError) already says where
_TAIL_BYTES = 65536
_READ_BYTES = 65536  # below malloc's mmap threshold: no mmap/munmap per read
_PIPE_BYTES = 1 << 20  # the script's pipes: what it may write while the relay sleeps
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_LINE_BYTES = 1 << 20  # a line longer than this goes out in pieces
COALESCE_SECONDS = 0.05  # in a burst of output, at most one relay pass per this many seconds
DRAIN_SECONDS = 5.0  # after the script exited, for what is still in (or held open on) its pipes


def parse_exception(stderr_tail: list[str]) -> dict[str, str] | None:
    """The exception the script died of, from what it printed: the last Python traceback, or
    a SyntaxError (which Python prints with no 'Traceback' header) with its file and line."""
    lines = [_RANK_PREFIX.sub("", line) for line in stderr_tail]
    start = None
    for index, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
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
    their reason there."""
    for line in reversed(stderr_tail):
        if line.strip():
            return line.strip()[:500]
    return None


def shown(rank: int, spec: str) -> bool:
    spec = spec.strip().lower()
    return spec in ("", "all") or str(rank) in {item.strip() for item in spec.split(",")}


def write_fully(fd: int, data: bytes) -> None:
    """All of `data` to `fd`, whatever the writes take; OSError (EPIPE, ENOSPC, EIO) raised."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # another process made a shared console non-blocking
            select.select([], [fd], [], 1.0)
        except InterruptedError:
            continue


def write_all(fd: int, data: bytes) -> None:
    """`write_fully`, where a reader that went away (EPIPE) is no error."""
    with contextlib.suppress(BrokenPipeError):
        write_fully(fd, data)


def console_stderr(path: str | None) -> int:
    """Where this rank's stderr lines go: the container's stderr itself, the bootstrap's fd 2
    reopened through /proc (`path`, from the command file), so they skip torchrun's stderr
    pipe and the bootstrap's pump; torchrun's stderr (our inherited fd 2) when it cannot be
    opened. O_APPEND: on a regular file (which the bootstrap put in append mode too) no
    writer overwrites another's lines."""
    if path:
        try:
            return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            pass
    return 2


def atomic_size(fd: int) -> int:
    """The largest write that reaches `fd` whole when other processes write to it too:
    PIPE_BUF on a pipe (a longer write may be interleaved with another rank's), else 0 (a
    regular file in append mode takes each write whole, and so does a terminal: the kernel
    holds its write lock for the whole write)."""
    try:
        return select.PIPE_BUF if stat.S_ISFIFO(os.fstat(fd).st_mode) else 0
    except OSError:
        return 0


def console_lock(fd: int) -> int | None:
    """A descriptor to lock the pipe `fd` writes to (flock), or None for anything else.

    A write longer than PIPE_BUF to a pipe is not atomic: when the pipe fills mid-write the
    kernel lets another writer in, and another rank's bytes land inside the line. So every
    writer of a host's console holds an exclusive flock on the pipe itself while it writes a
    batch: the ranks' wrappers and (logs.py, the bootstrap's own lines) anyone else who uses
    `locked_write`. flock conflicts between open file descriptions, and a rank's fd 1 is
    one description shared with every other rank (inherited from torchrun): so the lock is
    taken on a description of our own, the pipe reopened through /proc. Nothing to configure:
    every process that can write to the pipe can reopen it."""
    if not atomic_size(fd):
        return None
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:  # O_NONBLOCK: never wait for a reader (ENXIO when there is none: nothing to lock)
        return os.open(f"/proc/self/fd/{fd}", flags)
    except OSError:
        return None


class Console:
    """One console stream of this rank (the container's stdout or stderr): each batch of whole
    tagged lines is written under the console's lock (`console_lock`), in writes of at most
    PIPE_BUF bytes cut at line ends, so a writer that does not lock still cannot land inside
    a line of ours that fits one write. A write that fails (EPIPE: nobody reads it any more;
    EIO) stops this console for good, once, and `on_error` is told why: the rank log goes on.
    """

    def __init__(
        self,
        fd: int,
        name: str = "console",
        atomic: int | None = None,
        on_error: Callable[[Console, str], None] | None = None,
    ) -> None:
        self.fd = fd
        self.name = name
        self.atomic = atomic_size(fd) if atomic is None else atomic
        self.lock = console_lock(fd) if self.atomic else None
        self.on_error = on_error
        self.error: str | None = None

    def write(self, data: bytes) -> None:
        if self.error is not None:
            return
        locked = self.lock is not None and self._flock(fcntl.LOCK_EX)
        try:
            self._write(data)
        except OSError as error:
            self.error = f"{self.name} stopped: {error.strerror or error}"
            if self.on_error is not None:
                self.on_error(self, self.error)
        finally:
            if locked:
                self._flock(fcntl.LOCK_UN)

    def _flock(self, operation: int) -> bool:
        """Lock or unlock; a lock that fails (it should not) is given up, never the write."""
        assert self.lock is not None
        try:
            fcntl.flock(self.lock, operation)
        except OSError:
            self.close()
            return False
        return True

    def _write(self, data: bytes) -> None:
        """Writes of at most `atomic` bytes, each ending at a line end (a longer line whole)."""
        limit = self.atomic
        if not limit or len(data) <= limit:
            write_fully(self.fd, data)
            return
        start, size = 0, len(data)
        while start < size:
            end = data.rfind(b"\n", start, start + limit) + 1
            if end <= start:  # one line longer than `atomic`: whole, under the lock
                end = data.find(b"\n", start + limit) + 1 or size
            write_fully(self.fd, data[start:end])
            start = end

    def close(self) -> None:
        if self.lock is not None:
            with contextlib.suppress(OSError):
                os.close(self.lock)
            self.lock = None


def locked_write(fd: int, data: bytes) -> None:
    """One batch to a console that ranks share, under its lock (`console_lock`): for a writer
    other than a rank's relay (the bootstrap's own log lines). OSError is the caller's."""
    lock = console_lock(fd)
    if lock is None:
        write_fully(fd, data)
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        write_fully(fd, data)
    finally:
        os.close(lock)  # releases the lock


class RankLog:
    """The rank's log file. It never ends training: a write that fails (ENOSPC, EDQUOT, EIO)
    stops the log for good, once, with `error` saying where and why and `on_error` told (the
    wrapper prints it on the console, which still gets every line). A stopped log still shows
    that the rank is alive: its time is touched (at most once a second; a metadata update needs
    no free block), which is what the hang watchdog reads (hang.Activity)."""

    def __init__(
        self, fd: int | None, path: str = "", on_error: Callable[[str], None] | None = None
    ) -> None:
        self.fd = fd
        self.path = path
        self.on_error = on_error
        self.error: str | None = None
        self._touched = 0.0

    @classmethod
    def open(cls, path: Path, on_error: Callable[[str], None] | None = None) -> RankLog:
        """The log at `path` in append mode; one that cannot be created is stopped at once."""
        log = cls(None, escaped(str(path)), on_error)
        try:
            log.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as error:
            log._stop(f"rank log {log.path} not written: {error.strerror or error}")
        return log

    def write(self, data: bytes) -> None:
        if self.error is not None:
            self._touch()
            return
        if self.fd is None:
            return
        try:
            write_fully(self.fd, data)
        except OSError as error:
            try:
                size = f"{os.fstat(self.fd).st_size:,}"
            except OSError:
                size = "?"
            reason = error.strerror or str(error)
            self._stop(f"rank log {self.path} stopped at {size} bytes: {reason}")

    def _stop(self, what: str) -> None:
        self.error = what
        if self.on_error is not None:
            self.on_error(what)

    def _touch(self) -> None:
        """A sign of life for the hang watchdog where lines no longer reach the log."""
        now = time.monotonic()
        if now - self._touched < 1.0:
            return
        self._touched = now
        if self.fd is None:
            report_progress()
            return
        with contextlib.suppress(OSError):
            os.utime(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


class Relay:
    """One stream of the script: whole lines, tagged, to the console (if shown) and the log.

    Bytes only: `feed` takes whatever one read returned; its complete lines are masked, tagged
    and written at once, one write to the log and one batch to the console (under the
    console's lock, so no other rank's bytes land inside a line: `Console`). `\r` ends a line
    too, so progress bars show; `\r\n` is one line end even when a read splits it. An
    unterminated line waits for its end, up to _LINE_BYTES. The last _TAIL_BYTES of stderr
    are kept for the record. A console or a log given as a plain descriptor is wrapped.
    """

    def __init__(
        self,
        console: Console | int | None,
        log: RankLog | int,
        prefix: bytes,
        masker: Masker,
        keep_tail: bool,
        atomic: int = 0,
    ) -> None:
        if isinstance(console, int):
            console = Console(console, atomic=atomic)
        self.console = console
        self.log = RankLog(log) if isinstance(log, int) else log
        self.prefix = prefix
        self.masker = masker
        self.tail: collections.deque[bytes] | None = collections.deque() if keep_tail else None
        self.tail_size = 0
        self.pending = b""
        self.after_cr = False  # the last line emitted ended with \r: a leading \n is its end

    def feed(self, chunk: bytes) -> bool:
        """Take the next bytes of the stream; True when they completed at least one line."""
        if self.after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        data = self.pending + chunk if self.pending else chunk
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        held = self.masker.held(data[:cut]) if cut and self.masker else 0
        if held:  # the first lines of a multi-line secret, maybe: wait for the rest
            cut = max(data.rfind(b"\n", 0, cut - held), data.rfind(b"\r", 0, cut - held)) + 1
        self.after_cr = cut == len(data) and data[-1:] == b"\r"
        if cut:
            self.emit(data[:cut])
            data = data[cut:]
        if len(data) > _LINE_BYTES:
            data = self._cut_long(data)
        self.pending = data
        return cut > 0

    def close(self) -> None:
        """End of the stream: a last unterminated line is written too."""
        if self.pending:
            self.emit(self.pending + b"\n")
            self.pending = b""

    def pump(self, fd: int) -> None:
        """Relay one blocking stream to its end (the wrapper itself uses `relay`)."""
        while True:
            try:
                chunk = os.read(fd, _READ_BYTES)
            except InterruptedError:
                continue
            if not chunk:
                break
            self.feed(chunk)
        self.close()

    def _cut_long(self, data: bytes) -> bytes:
        """A line longer than _LINE_BYTES goes out in pieces of that size. Masked before it is
        cut, and the last (longest secret - 1) bytes held back: a secret that a cut would
        split can only start there, so it is masked whole once the rest of it arrives."""
        if self.masker:
            data = self.masker.data(data)
        secrets = [s.encode("utf-8", "surrogateescape") for s in self.masker.secrets]
        keep = max((len(s) for s in secrets), default=1) - 1
        while len(data) - keep > _LINE_BYTES:
            self.emit(data[:_LINE_BYTES] + b"\n")
            data = data[_LINE_BYTES:]
        return data

    def emit(self, block: bytes) -> None:
        if b"\r" in block:
            block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self.masker:
            block = self.masker.data(block)
        self.log.write(block)
        if self.console is not None:
            prefix = self.prefix
            self.console.write(prefix + block[:-1].replace(b"\n", b"\n" + prefix) + b"\n")
        if self.tail is not None:
            self.tail.append(block)
            self.tail_size += len(block)
            while self.tail_size > _TAIL_BYTES and len(self.tail) > 1:
                self.tail_size -= len(self.tail.popleft())

    def tail_lines(self) -> list[str]:
        if self.tail is None:
            return []
        return b"".join(self.tail).decode("utf-8", errors="replace").splitlines()[-400:]


def relay(
    child: subprocess.Popen,
    streams: list[tuple[int, Relay]],
    window: float = COALESCE_SECONDS,
    drain: float = DRAIN_SECONDS,
) -> int:
    """Relay the script's pipes from this one thread until both end, or `drain` seconds
    after the script exited (a process it started may hold them open); its exit status.

    Wake-ups, not bytes, are what a relay costs: `python -u` writes each print in two
    syscalls, and waking per write cost more CPU than the lines themselves. So after a pass
    that relayed a line the loop sleeps out the rest of `window` before it looks again; what
    the script writes meanwhile waits in the pipe (enlarged to _PIPE_BYTES, so the script does
    not block) and goes out in one read and one write per destination. A line after a quiet
    spell goes out at once (a pass that got only part of a line does not sleep); in a burst,
    a line waits at most `window`.
    """
    selector = selectors.DefaultSelector()
    live: dict[int, Relay] = {}
    for fd, stream in streams:
        os.set_blocking(fd, False)
        with contextlib.suppress(OSError):  # more than the default 64 KiB: fine if refused
            fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_BYTES)
        selector.register(fd, selectors.EVENT_READ, stream)
        live[fd] = stream
    exited = _pidfd(child.pid)  # readable once the script has exited
    if exited is not None:
        selector.register(exited, selectors.EVENT_READ, None)
    deadline: float | None = None
    try:
        while live:
            if deadline is not None:
                timeout: float | None = max(0.0, deadline - time.monotonic())
            else:
                timeout = None if exited is not None else 0.5
            events = selector.select(timeout)
            woke = time.monotonic()
            relayed = False
            for key, _ in events:
                if key.data is None:  # the pidfd
                    selector.unregister(key.fd)
                    deadline = woke + drain
                    continue
                while True:
                    try:
                        chunk = os.read(key.fd, _READ_BYTES)
                    except BlockingIOError:
                        break
                    if not chunk:
                        live.pop(key.fd).close()
                        selector.unregister(key.fd)
                        break
                    relayed = key.data.feed(chunk) or relayed
                    if len(chunk) < _READ_BYTES:
                        break
            if deadline is None and exited is None and child.poll() is not None:
                deadline = woke + drain
            if deadline is not None and time.monotonic() >= deadline:
                break
            if relayed and live:
                rest = window - (time.monotonic() - woke)
                if rest > 0:
                    time.sleep(rest)
    finally:
        for stream in live.values():
            stream.close()
        selector.close()
        if exited is not None:
            os.close(exited)
    return child.wait()


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Linux before 5.3, or not Linux
        return None


def _exec_failure(script: str, error: OSError | ValueError) -> tuple[int, dict[str, str]]:
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


def _keep_alive(done: threading.Event) -> None:
    """Progress reports for the hang watchdog, every second until `done`."""
    while not done.wait(1.0):
        report_progress()


# in the control folder (one per job and host): a rank of this host passed / failed the preflight
PREFLIGHT_PASSED, PREFLIGHT_FAILED = "preflight-passed", "preflight-failed"
STOP_FILE = "stop"  # written by the bootstrap before it signals the workers of a stop


ORPHAN_SIGNAL = signal.SIGRTMIN + 3  # PR_SET_PDEATHSIG: the kernel's word that torchrun died
_PR_SET_PDEATHSIG = 1


def end_with_parent() -> None:
    """Outside a container nothing ends a rank whose bootstrap was SIGKILLed (torchrun then dies
    with it, by its own PR_SET_PDEATHSIG; its workers run in sessions of their own): the kernel
    signals this wrapper when its parent dies, and the wrapper kills its process group, which
    holds the script. A real-time signal nobody else sends, and only acted on once the parent
    really changed (the kernel also sends it when the thread that started us ends)."""
    parent = os.getppid()

    def orphaned(_signum: int, _frame: object) -> None:
        if os.getppid() != parent:
            os.killpg(os.getpgrp(), signal.SIGKILL)

    signal.signal(ORPHAN_SIGNAL, orphaned)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(ORPHAN_SIGNAL))
    except (OSError, AttributeError):
        return
    orphaned(ORPHAN_SIGNAL, None)  # it died before that took


_RESERVE_BYTES = 64 * 1024  # kept free for the rank's record on a disk its log may fill


def _reserve(folder: Path) -> int | None:
    """Space for the record on a disk that the logs may fill: an unlinked file holding
    _RESERVE_BYTES (so nothing is left behind, whatever ends this process); closing it gives
    them back. None where it cannot be made (the disk is full already)."""
    path = folder / f".reserve-{os.getpid()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        path.unlink()
    try:
        os.posix_fallocate(fd, 0, _RESERVE_BYTES)
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


def main(argv: list[str]) -> int:
    stop: dict[str, Any] = {}  # the first stop signal this rank got (its name) and when

    def note_stop(signum: int, _frame: object) -> None:
        stop.setdefault("signal", signal_name(signum))
        stop.setdefault("at", time.time())

    for sig in STOP_SIGNALS:  # first: a stop during the start is noted, never a traceback
        signal.signal(sig, note_stop)
    early: dict[int, float] = globals().get("_EARLY") or {}  # noted while this module loaded
    if early:
        signum, at = min(early.items(), key=lambda item: item[1])
        stop.update(signal=signal_name(signum), at=at)
    end_with_parent()
    control = Path(os.environ.get(CONTROL_ENV) or ".")
    try:
        job: dict[str, Any] = json.loads((control / "command.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        where = escaped(str(control))
        print(f"container_entry.worker: no command in {where}: {error}", file=sys.stderr)
        return 2
    command: list[str] = list(job["argv"]) + list(argv)
    script = command[0]
    run_dir = Path(job["run_dir"])
    masker = Masker(job.get("secrets") or ())
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    host = os.environ.get("CURRENT_HOST") or os.environ.get("HOSTNAME", "localhost")
    prefix = encoded(f"[{host} rank {rank}] ")
    console = shown(rank, str(job.get("console_ranks", "all")))
    err_console = Console(console_stderr(job.get("console_stderr")), "console (stderr)")
    out_console = Console(1, "console (stdout)")
    trouble: dict[str, str] = {}  # what stopped: the rank log, a console

    def say(text: str) -> None:
        """One line of ours about this rank, on its stderr console."""
        err_console.write(prefix + encoded(f"container-entry: {text}") + b"\n")

    def log_stopped(what: str) -> None:
        trouble.setdefault("log_error", what)
        if console:
            say(f"{what}; the console still has every line")
        else:
            say(f"{what}; CONSOLE_RANKS hides this rank, so its lines are kept nowhere now")

    def console_stopped(stream: Console, what: str) -> None:
        trouble.setdefault("console_error", what)
        log.write(encoded(f"container-entry: {what}; the rank log still has every line\n"))

    for folder in (run_dir / "logs", run_dir / "stacks"):
        with contextlib.suppress(OSError):  # a full disk: the log says so below
            folder.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "logs" / f"rank-{rank}.log"
    log = RankLog.open(log_path, log_stopped)
    for stream in (out_console, err_console):
        stream.on_error = console_stopped
    reserve = _reserve(run_dir)

    env = dict(os.environ)
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a segfault prints the Python stacks
    # stacks on demand (SIGUSR2) for the teardown report and `container-entry stacks`: first on
    # PYTHONPATH (the folder holds nothing else) so a sitecustomize of the user's own cannot hide
    # it; ours then runs theirs
    env[STACKS_ENV] = str(run_dir / "stacks" / f"rank-{rank}.txt")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SITE_DIR, env.get("PYTHONPATH")) if p)
    with contextlib.suppress(OSError):  # a full disk: no flight-recorder dump for this rank
        env.update(flight_recorder.listen(control, run_dir, rank))
    env.pop(CONTROL_ENV, None)
    program = [sys.executable, "-u", *command] if script.endswith(".py") else command

    def stopping() -> bool:
        """A stop was signalled to this rank, or came before torchrun started it."""
        if not stop and (control / STOP_FILE).exists():
            stop.setdefault("signal", "SIGTERM")
            stop.setdefault("at", time.time())
        return bool(stop)

    started = time.time()
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)

    def run(argv: list[str], name: str) -> tuple[int, dict[str, str] | None, list[Relay]]:
        """One child in this rank's slot, its output relayed: (status, exec failure, relays).
        A stop that came first means no child at all; one that came while it was being started
        (before it could be in this process group) is passed on to it."""
        relays = [
            Relay(out_console if console else None, log, prefix, masker, False),
            Relay(err_console if console else None, log, prefix, masker, True),
        ]
        if stopping():
            return 128 + (signal_number(stop["signal"]) or signal.SIGTERM), None, relays
        try:
            child = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=os.getcwd()
            )
        except (OSError, ValueError) as error:  # ValueError: an argument that is no C string
            code, failure = _exec_failure(name, error)
            log.write(encoded(failure["message"] + "\n"))
            err_console.write(prefix + encoded(failure["message"]) + b"\n")
            return code, failure, relays
        if stop:  # it arrived during the start: this child may not have had it
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal_number(stop["signal"]) or signal.SIGTERM)
        pid_file = control / f"rank-{rank}.pid"
        try:
            write_json(
                pid_file, {"rank": rank, "wrapper": os.getpid(), "child": child.pid, "host": host}
            )
        except OSError as error:  # the launcher still finds this rank as torchrun's child
            say(f"pid file {escaped(str(pid_file))} not written: {error.strerror or error}")
        assert child.stdout is not None and child.stderr is not None
        streams = [child.stdout.fileno(), child.stderr.fileno()]
        return relay(child, list(zip(streams, relays, strict=True))), None, relays

    # The preflight runs first in this same slot, so the job needs one torchrun launch, not two;
    # only if it passes does the script start. Once per job on each host: restarts
    # skip it, known from a marker, not from TORCHELASTIC_RESTART_COUNT: a host whose workers
    # did not fail themselves rejoins the new round at torchrun's count 0. A failed
    # preflight ends the job (failure.permanent), but torchrun with restarts may start the group
    # again before the bootstrap tears it down: that attempt runs nothing and leaves the first
    # attempt's record as it is.
    stage = None
    status, exception, relays = 0, None, []
    preflight = job.get("preflight")
    if preflight and (control / PREFLIGHT_FAILED).exists():
        log.close()
        if reserve is not None:
            os.close(reserve)
        return 0 if stopping() else 1
    if preflight and not (control / PREFLIGHT_PASSED).exists():
        # the preflight has its own deadline: while it runs it is never a hang (HANG_TIMEOUT)
        checking = threading.Event()
        threading.Thread(target=_keep_alive, args=(checking,), daemon=True).start()
        try:
            status, exception, relays = run([sys.executable, "-u", *preflight], preflight[0])
        finally:
            checking.set()
        if status:
            stage = "preflight"
        with contextlib.suppress(OSError):
            (control / (PREFLIGHT_FAILED if status else PREFLIGHT_PASSED)).touch()
    if not status:  # (not started either when a stop came while the preflight ran)
        if preflight:
            report_progress()  # the script's start-up counts from its own start, as at launch
        status, exception, relays = run(program, script)
    log.close()

    lines = relays[1].tail_lines()
    stopped = stopping()
    record = RankRecord(
        host=host,
        rank=rank,
        local_rank=local_rank,
        stage=stage,
        # torchrun's count on this host; a failure with restarts > 0 used them all up
        restart_count=restart_count,
        returncode=status,
        signal=signal_name(-status) if status < 0 else None,
        exception=exception or parse_exception(lines),
        fatal_error=fatal_error(lines),
        last_words=last_words(lines) if status else None,
        stop_signal=stop.get("signal"),
        stop_requested_at=stop.get("at"),
        started_at=started,
        ended_at=time.time(),
        stderr_tail=lines[-40:],
        log=str(log_path),
        log_error=trouble.get("log_error"),
        console_error=trouble.get("console_error"),
    )
    problem = save_record(run_dir / f"rank-{rank}.json", record.to_json(), reserve)
    if problem:
        say(problem)
    for stream in (out_console, err_console):
        stream.close()
    if stopped:  # torchrun must not take this for a failure (the record has the status)
        return 0
    if status < 0:  # die the same way so torchrun reports the real signal
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's disposition is fixed
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status  # it is blocked or ignored here: the shell's code for it
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
