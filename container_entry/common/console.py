"""A host's console, shared by its ranks' wrappers and the bootstrap: writes that stay whole.

Every rank of a host writes its tagged lines to the same pipe (the container's stdout or stderr),
and a write longer than PIPE_BUF to a pipe may be cut by another writer's bytes. So each batch is
written under an flock of the pipe (`console_lock`), by the ranks' relays (`Console`) and by the
bootstrap's own lines (`locked_write`, logs.py) alike; a console nobody reads (EPIPE, EIO) stops
a rank's console once and never ends training. Stdlib only: the worker wrapper imports it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import stat
from collections.abc import Callable


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
