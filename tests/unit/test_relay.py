"""The worker's line relay (container_entry.rank.relay) and console
(container_entry.common.console) on real pipes and files: how bytes
become tagged lines, masked, in the log and on the console, whatever the reads cut."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import select
import threading
import time
from pathlib import Path

import pytest

from container_entry.common import console as console_io
from container_entry.common.console import (
    Console,
    atomic_size,
    console_stderr,
    locked_write,
    write_all,
)
from container_entry.common.masking import MASK, Masker
from container_entry.rank import relay as line_relay
from container_entry.rank.relay import RankLog, Relay

PREFIX = b"[algo-1 rank 0] "
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def patch_writes(monkeypatch, write) -> None:
    """Every write of the relay's destinations, the console and the rank log, through `write`."""
    for module in (console_io, line_relay):
        monkeypatch.setattr(module, "write_fully", write)


class Sinks:
    """The relay's console and log as files; what each holds, as bytes."""

    def __init__(self, tmp_path: Path) -> None:
        self.console_path, self.log_path = tmp_path / "console", tmp_path / "log"
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        self.console = os.open(self.console_path, flags, 0o600)
        self.log = os.open(self.log_path, flags, 0o600)

    def relay(self, secrets=(), keep_tail=True, console=True) -> Relay:
        masker = Masker(secrets)
        return Relay(self.console if console else None, self.log, PREFIX, masker, keep_tail)

    def shown(self) -> bytes:
        return self.console_path.read_bytes()

    def logged(self) -> bytes:
        return self.log_path.read_bytes()


@pytest.fixture
def sinks(tmp_path):
    made = Sinks(tmp_path)
    yield made
    os.close(made.console)
    os.close(made.log)


def through_pipe(relay: Relay, writes: list[bytes]) -> None:
    """Each bytes object one write into a real pipe, while `relay.pump` reads the other end."""
    read, write = os.pipe()
    pump = threading.Thread(target=relay.pump, args=(read,))
    pump.start()
    for data in writes:
        write_all(write, data)
    os.close(write)
    pump.join(timeout=30)
    os.close(read)
    assert not pump.is_alive()


def test_partial_lines_wait_for_their_end(sinks):
    relay = sinks.relay()
    relay.feed(b"hel")
    assert sinks.shown() == b"" and sinks.logged() == b""
    relay.feed(b"lo\nwor")
    assert sinks.shown() == PREFIX + b"hello\n"
    relay.feed(b"ld\n")
    assert sinks.shown() == PREFIX + b"hello\n" + PREFIX + b"world\n"
    assert sinks.logged() == b"hello\nworld\n"


def test_every_line_of_a_chunk_is_tagged_in_one_write(sinks, monkeypatch):
    writes: list[tuple[int, bytes]] = []
    patch_writes(monkeypatch, lambda fd, data: writes.append((fd, data)))
    relay = sinks.relay()
    relay.feed(b"one\ntwo\nthree\n")
    assert writes == [
        (sinks.log, b"one\ntwo\nthree\n"),
        (sinks.console, PREFIX + b"one\n" + PREFIX + b"two\n" + PREFIX + b"three\n"),
    ]


def test_carriage_return_ends_a_line_so_progress_bars_show(sinks):
    relay = sinks.relay()
    relay.feed(b"\r 10%|#")
    relay.feed(b"  |\r 50%|##### |\r100%|##########|\n")
    lines = sinks.shown().split(b"\n")
    assert PREFIX + b" 10%|#  |" in lines
    assert PREFIX + b" 50%|##### |" in lines
    assert PREFIX + b"100%|##########|" in lines
    assert b"\r" not in sinks.shown() + sinks.logged()


def test_crlf_split_across_reads_is_one_line_end(sinks):
    relay = sinks.relay()
    through_pipe(relay, [b"first\r", b"\nsecond\r\n", b"third\r", b"\n"])
    assert sinks.logged() == b"first\nsecond\nthird\n"
    assert sinks.shown() == b"".join(PREFIX + x + b"\n" for x in (b"first", b"second", b"third"))


def test_a_lone_carriage_return_before_a_later_newline_still_ends_a_line(sinks):
    relay = sinks.relay()
    assert relay.feed(b"bar 1\r")
    assert not relay.feed(b"bar 2")
    assert relay.feed(b"\nbar 3\rbar 4")  # this \n ends "bar 2": it is no \r\n
    assert relay.feed(b"\n")
    assert sinks.logged() == b"bar 1\nbar 2\nbar 3\nbar 4\n"


def test_lines_longer_than_a_pipe_read_arrive_whole(sinks):
    long = b"x" * 200_000  # > 64 KiB: several reads of the pipe
    relay = sinks.relay()
    through_pipe(relay, [b"before\n", long[:70_000], long[70_000:] + b"\nafter\n"])
    assert sinks.logged() == b"before\n" + long + b"\nafter\n"
    assert sinks.shown().split(b"\n")[1] == PREFIX + long


def test_a_line_longer_than_the_cap_goes_out_in_pieces_with_nothing_lost(sinks):
    size = line_relay._LINE_BYTES * 2 + 10
    relay = sinks.relay()
    through_pipe(relay, [b"y" * size, b"\nend\n"])
    logged = sinks.logged()
    assert logged.replace(b"\n", b"") == b"y" * size + b"end"
    pieces = logged.split(b"\n")[:-2]  # the line's pieces, then "end"
    assert len(pieces) >= 2
    assert max(len(piece) for piece in pieces) <= line_relay._LINE_BYTES + line_relay._READ_BYTES


def test_invalid_utf8_passes_through_unchanged(sinks):
    data = b"caf\xc3\xa9 \xff\xfe broken \xc3\n\x80 more\n"
    relay = sinks.relay()
    through_pipe(relay, [data[:7], data[7:]])  # cut inside a multi-byte character
    assert sinks.logged() == data
    assert sinks.shown() == PREFIX + b"caf\xc3\xa9 \xff\xfe broken \xc3\n" + PREFIX + b"\x80 more\n"
    assert relay.tail_lines()[0].startswith("café")  # the record decodes with replacement


def test_a_secret_split_across_writes_is_masked_in_console_and_log(sinks):
    secret = "hf_TOPSECRET123"
    relay = sinks.relay(secrets=[secret])
    through_pipe(relay, [b"token=hf_TOP", b"SECRET", b"123 done\nagain ", b"hf_TOPSECRET123\n"])
    for text in (sinks.shown(), sinks.logged()):
        assert b"TOPSECRET" not in text
        assert text.count(MASK.encode()) == 2
    assert sinks.logged() == f"token={MASK} done\nagain {MASK}\n".encode()
    assert not any("TOPSECRET" in line for line in relay.tail_lines())


def test_a_secret_across_the_cut_of_an_over_long_line_is_masked(sinks):
    secret = "sk-ABCDEFGHIJKLMNOP"
    relay = sinks.relay(secrets=[secret])
    head = b"z" * (line_relay._LINE_BYTES - 5)  # the cut would fall inside the secret
    through_pipe(relay, [head + secret.encode()[:10], secret.encode()[10:] + b" tail\n"])
    logged = sinks.logged()
    assert b"ABCDEFG" not in logged and b"HIJKLMNOP" not in logged
    assert MASK.encode() in logged and logged.endswith(b" tail\n")


def test_the_last_unterminated_line_is_written_at_end_of_stream(sinks):
    relay = sinks.relay()
    through_pipe(relay, [b"complete\n", b"no newline at the end"])
    assert sinks.logged() == b"complete\nno newline at the end\n"
    assert sinks.shown().endswith(PREFIX + b"no newline at the end\n")


def test_a_rank_not_shown_still_logs_every_line(sinks):
    relay = sinks.relay(console=False)
    through_pipe(relay, [b"a\nb\n"])
    assert sinks.shown() == b"" and sinks.logged() == b"a\nb\n"


def test_the_stderr_tail_keeps_the_last_lines(sinks):
    relay = sinks.relay()
    through_pipe(relay, [b"".join(b"line %d\n" % i for i in range(20_000))])
    tail = relay.tail_lines()
    assert tail[-1] == "line 19999" and len(tail) == 400
    assert sinks.relay(keep_tail=False).tail_lines() == []


def test_the_stderr_relay_times_the_start_of_the_last_traceback(sinks):
    """RankRecord.failed_at: when the script's fatal traceback began, not when it exited."""
    relay = sinks.relay()
    before = time.time()  # feed takes the moment as it emits the line: bracketed, not a margin
    relay.feed(b"step 1\nTraceback (most recent call last):\n")
    after = time.time()
    first = relay.traceback_at
    assert first is not None and before <= first <= after
    time.sleep(0.05)
    relay.feed(b'  File "x.py", line 1\nValueError: caught and logged\n')
    assert relay.traceback_at == first  # a traceback's own lines leave it
    relay.feed(b"Traceback (most recent call last):\n")  # split: its end in the next read
    relay.feed(b'  File "x.py", line 2\nRuntimeError: fatal\n')
    assert relay.traceback_at is not None and relay.traceback_at > first
    plain = sinks.relay()
    plain.feed(b"no traceback here\n")
    assert plain.traceback_at is None


def test_writes_to_a_shared_pipe_stay_within_pipe_buf_and_end_at_a_line_end(sinks, monkeypatch):
    read, write = os.pipe()
    assert atomic_size(write) == select.PIPE_BUF
    assert atomic_size(sinks.log) == 0  # a regular file in append mode takes a write whole
    writes: list[bytes] = []
    patch_writes(monkeypatch, lambda fd, data: writes.append(data))
    relay = Relay(write, sinks.log, PREFIX, Masker(), False, atomic=select.PIPE_BUF)
    lines = [b"%05d " % i + b"w" * (i % 300) for i in range(400)]
    lines.append(b"L" * 10_000)  # one line longer than PIPE_BUF goes out whole
    relay.feed(b"\n".join(lines) + b"\n")
    console = writes[1:]  # writes[0] went to the log
    assert len(console) > 1
    assert all(chunk.endswith(b"\n") for chunk in console)
    assert all(len(chunk) <= select.PIPE_BUF for chunk in console[:-1])
    assert b"".join(console) == b"".join(PREFIX + line + b"\n" for line in lines)
    os.close(read)
    os.close(write)


def test_write_all_waits_out_a_full_non_blocking_pipe():
    read, write = os.pipe()
    os.set_blocking(write, False)
    data = b"q" * 300_000  # more than the pipe holds
    received = bytearray()

    def drain() -> None:
        while chunk := os.read(read, 65536):
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    write_all(write, data)
    os.close(write)
    reader.join(timeout=30)
    os.close(read)
    assert bytes(received) == data


def test_console_stderr_opens_the_given_stream_or_falls_back_to_fd_2(tmp_path):
    read, write = os.pipe()
    fd = console_stderr(f"/proc/{os.getpid()}/fd/{write}")
    assert fd not in (2, write)
    os.write(fd, b"through /proc\n")
    assert os.read(read, 100) == b"through /proc\n"
    for fd_ in (fd, read, write):
        os.close(fd_)
    assert console_stderr(str(tmp_path / "missing")) == 2
    assert console_stderr(None) == 2


def test_long_lines_from_processes_sharing_one_pipe_stay_whole():
    """Two processes that inherited one pipe (one open file description, as a rank's fd 1
    from torchrun) write 20 KB lines through Console while the reader is slow: each locks the
    pipe through a description of its own, so no line is cut by the other's bytes."""
    read, write = os.pipe()
    fcntl.fcntl(read, F_SETPIPE_SZ, 4096)  # one page: every long write waits for the reader
    children = []
    for rank in (0, 1):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.close(read)
                console = Console(write)
                for i in range(60):
                    head = b"[rank %d] line %d " % (rank, i)
                    console.write(head + b"z" * (20_000 - len(head)) + b"\n")
            finally:
                os._exit(0)
        children.append(pid)
    os.close(write)
    received = bytearray()
    while chunk := os.read(read, 3000):
        received.extend(chunk)
        time.sleep(0.0002)
    os.close(read)
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0
    lines = bytes(received).split(b"\n")[:-1]
    assert len(lines) == 120
    cut = [line[:40] for line in lines if not re.fullmatch(rb"\[rank \d\] line \d+ z+", line)]
    assert not cut and {len(line) for line in lines} == {20_000}, cut[:3]


def test_a_console_write_takes_the_lock_only_for_a_pipe(tmp_path, sinks):
    read, write = os.pipe()
    assert Console(write).lock is not None
    assert Console(sinks.console).lock is None  # a regular file in append mode: whole writes
    os.close(read)
    os.close(write)


@pytest.mark.parametrize(("path", "error"), [("/dev/full", "No space left on device")])
def test_a_rank_log_that_fails_stops_once_and_the_console_gets_every_line(sinks, path, error):
    """The relay never ends training: a log write that fails (a full disk) stops the log,
    says so once, and every line still reaches the console."""
    told: list[str] = []
    log = RankLog.open(Path(path), told.append)
    relay = Relay(Console(sinks.console), log, PREFIX, Masker(), True)
    through_pipe(relay, [b"first\n", b"second\nthird\n", b"fourth\n"])
    assert told == [f"rank log {path} stopped at 0 bytes: {error}"]
    assert log.error == told[0]
    expected = b"".join(PREFIX + x + b"\n" for x in (b"first", b"second", b"third", b"fourth"))
    assert sinks.shown() == expected
    assert relay.tail_lines() == ["first", "second", "third", "fourth"]


def test_a_rank_log_that_cannot_be_created_is_stopped_at_once(tmp_path):
    told: list[str] = []
    log = RankLog.open(tmp_path / "missing-folder" / "rank-0.log", told.append)
    log.write(b"x\n")
    assert told == [
        f"rank log {tmp_path}/missing-folder/rank-0.log not written: No such file or directory"
    ]


def test_a_console_nobody_reads_stops_once_and_the_log_gets_every_line(sinks):
    read, write = os.pipe()
    os.close(read)  # EPIPE from now on
    told: list[str] = []
    console = Console(write, "console (stdout)", on_error=lambda _c, what: told.append(what))
    relay = Relay(console, sinks.log, PREFIX, Masker(), False)
    through_pipe(relay, [b"a\nb\n", b"c\n"])
    assert told == ["console (stdout) stopped: Broken pipe"]
    assert sinks.logged() == b"a\nb\nc\n"
    os.close(write)


def test_a_stopped_rank_log_still_shows_the_rank_is_alive(tmp_path, monkeypatch):
    """The hang watchdog reads the logs' times: a rank whose log stopped (a full disk) but who
    still prints is not idle. Its log's time is touched, at most once a second."""
    path = tmp_path / "rank-0.log"
    log = RankLog.open(path)
    log.write(b"before\n")
    os.utime(path, (1, 1))

    def full(_fd, _data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(line_relay, "write_fully", full)
    log.write(b"lost\n")  # the write that fails: the log stops
    assert log.error and path.stat().st_mtime == 1
    log.write(b"later\n")
    assert path.stat().st_mtime > time.time() - 60 and path.read_bytes() == b"before\n"


def test_locked_write_takes_the_same_lock_as_the_ranks(tmp_path):
    """For the bootstrap's own lines (logs.py): it waits while a rank holds the console."""
    read, write = os.pipe()
    rank = Console(write)
    fcntl.flock(rank.lock, fcntl.LOCK_EX)  # a rank in the middle of a batch
    done = threading.Event()
    writer = threading.Thread(target=lambda: (locked_write(write, b"ours\n"), done.set()))
    writer.start()
    assert not done.wait(0.2)
    fcntl.flock(rank.lock, fcntl.LOCK_UN)
    assert done.wait(5)
    writer.join()
    assert os.read(read, 100) == b"ours\n"
    rank.close()
    for fd in (read, write):
        os.close(fd)
    path = tmp_path / "file"
    with open(path, "ab") as handle:
        locked_write(handle.fileno(), b"a regular file needs no lock\n")
    assert path.read_bytes() == b"a regular file needs no lock\n"
