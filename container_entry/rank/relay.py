"""The line relay of a rank's wrapper: the script's stdout and stderr, from one thread, as whole
lines, tagged with host and rank and masked, to the console (`console.Console`, when the rank is
shown) and to the rank's log (`RankLog`), live: at once after a quiet spell, within
COALESCE_SECONDS in a burst (`relay`). Neither destination ends training when it fails (a full
disk, a console nobody reads): each stops once and says why. Stdlib only: the worker wrapper
imports it, and its CPU per line is what docs/benchmarks.md measures.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import selectors
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from container_entry.common.console import Console, write_fully
from container_entry.common.masking import Masker
from container_entry.common.text import TRACEBACK, escaped
from container_entry.diagnose.hang import report_progress

_TRACEBACK = TRACEBACK.encode()
_TAIL_BYTES = 65536
_READ_BYTES = 65536  # below malloc's mmap threshold: no mmap/munmap per read
_PIPE_BYTES = 1 << 20  # the script's pipes: what it may write while the relay sleeps
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_LINE_BYTES = 1 << 20  # a line longer than this goes out in pieces
COALESCE_SECONDS = 0.05  # in a burst of output, at most one relay pass per this many seconds
DRAIN_SECONDS = 5.0  # after the script exited, for what is still in (or held open on) its pipes
LINGER_POLL = 0.5  # how often a relay whose script exited looks whether its workers still run


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
        # when the stream's last traceback began: a rank's failure, timed before its exit closes
        # its sockets (a peer's error about them comes after: records.RankRecord.failed_at)
        self.traceback_at: float | None = None
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
            if _TRACEBACK in block:
                self.traceback_at = time.time()
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
    lingering: Callable[[], bool] | None = None,
) -> int:
    """Relay the script's pipes from this one thread until both end, or `drain` seconds
    after the script exited (a process it started may hold them open) and `lingering()` says
    none of its processes is still at work (an entry point that launched its own workers: they
    may checkpoint after it died of a stop); its exit status.

    Wake-ups, not bytes, are what a relay costs: `python -u` writes each print in two
    syscalls, and waking per write cost more CPU than the lines themselves. So after a pass
    that relayed a line the loop sleeps out the rest of `window` before it looks again; what
    the script writes meanwhile waits in the pipe (enlarged to _PIPE_BYTES, so the script does
    not block) and goes out in one read and one write per destination. A line after a quiet
    spell goes out at once (a pass that got only part of a line does not sleep); in a burst,
    a line waits at most `window`.
    """
    pipes = _Pipes(streams, child.pid)
    deadline: float | None = None
    gone = False  # the script exited
    try:
        while pipes.live:
            looks = time.monotonic() + LINGER_POLL if gone and lingering is not None else None
            woke, relayed, exited = pipes.wait(deadline if deadline is not None else looks)
            gone = gone or exited or (pipes.exited is None and child.poll() is not None)
            if deadline is None and gone and (lingering is None or not lingering()):
                deadline = woke + drain
            if deadline is not None and time.monotonic() >= deadline:
                break
            if relayed and pipes.live:
                rest = window - (time.monotonic() - woke)
                if rest > 0:
                    time.sleep(rest)
    finally:
        pipes.close()
    return child.wait()


class _Pipes:
    """The script's pipes (non-blocking, enlarged) and its pidfd, in one selector."""

    def __init__(self, streams: list[tuple[int, Relay]], pid: int) -> None:
        self.selector = selectors.DefaultSelector()
        self.live: dict[int, Relay] = {}
        for fd, stream in streams:
            os.set_blocking(fd, False)
            with contextlib.suppress(OSError):  # more than the default 64 KiB: fine if refused
                fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_BYTES)
            self.selector.register(fd, selectors.EVENT_READ, stream)
            self.live[fd] = stream
        self.exited = _pidfd(pid)  # readable once the script has exited
        if self.exited is not None:
            self.selector.register(self.exited, selectors.EVENT_READ, None)

    def wait(self, deadline: float | None) -> tuple[float, bool, bool]:
        """One wait (until a pipe has bytes, the script exits, or `deadline`) and every read it
        allows: (when it woke, whether a line went out, whether the pidfd said it exited)."""
        if deadline is not None:
            timeout: float | None = max(0.0, deadline - time.monotonic())
        else:  # without a pidfd, the script's exit is polled
            timeout = None if self.exited is not None else 0.5
        events = self.selector.select(timeout)
        woke = time.monotonic()
        relayed = exited = False
        for key, _ in events:
            if key.data is None:  # the pidfd
                self.selector.unregister(key.fd)
                exited = True
            else:
                relayed = self._read(key.fd, key.data) or relayed
        return woke, relayed, exited

    def _read(self, fd: int, stream: Relay) -> bool:
        """What the pipe holds now, to its stream (to its end: closed); True when a line went
        out."""
        relayed = False
        while True:
            try:
                chunk = os.read(fd, _READ_BYTES)
            except BlockingIOError:
                break
            if not chunk:
                self.live.pop(fd).close()
                self.selector.unregister(fd)
                break
            relayed = stream.feed(chunk) or relayed
            if len(chunk) < _READ_BYTES:
                break
        return relayed

    def close(self) -> None:
        for stream in self.live.values():
            stream.close()
        self.selector.close()
        if self.exited is not None:
            os.close(self.exited)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Linux before 5.3, or not Linux
        return None
