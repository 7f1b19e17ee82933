"""The launcher's side of flight-recorder dumps: a request reaches each listening rank's FIFO,
skips a rank nobody listens for, and the wait ends as soon as every asked rank's file landed
(or at the bound). The rank's side, a real Python with torch, is tests/integration."""

from __future__ import annotations

import os
import select
import threading
import time

from container_entry.common.layout import ControlDir, RunDir
from container_entry.diagnose import flight_recorder


def reader(path, then=None):
    """A rank's dump thread in miniature: wait on the FIFO for a request's byte, then answer.

    The read end is opened here, before the thread starts: `request` opens the FIFO without
    blocking and skips it (ENXIO) while nobody has it open for reading, and a thread left to
    open it itself may not have got that far under load (a 50-ms head start was not enough)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def serve():
        # A nonblocking read end reads b"" while no writer has it open (and stays readable
        # after a writer closed), EAGAIN while a writer holds it with nothing written: poll,
        # read, and retry either until the byte came or a cap, however busy the machine.
        try:
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline:
                select.select([fd], [], [], 0.05)
                try:
                    if os.read(fd, 1):
                        break
                except BlockingIOError:
                    pass
                time.sleep(0.01)
            else:
                return  # never asked: no answer
        finally:
            os.close(fd)
        if then:
            then()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def folders(tmp_path) -> tuple[ControlDir, RunDir]:
    control, run = ControlDir(tmp_path / "control"), RunDir(tmp_path / "run")
    control.path.mkdir()
    return control, run


def test_a_request_reaches_listening_ranks_and_skips_the_others(tmp_path):
    control, run = folders(tmp_path)
    for rank in (0, 1, 2):
        env = flight_recorder.listen(control, run, rank)
        assert env[flight_recorder.REQUEST_ENV] == str(control.dump_request(rank))
        assert env[flight_recorder.FILE_ENV] == str(run.dump(rank))
        assert control.dump_request(rank).name == f"dump-rank-{rank}.fifo"
    assert run.dumps.is_dir()
    threads = [reader(control.dump_request(rank)) for rank in (0, 2)]
    assert flight_recorder.request(control, [0, 1, 2, 5]) == [0, 2]  # 1: no reader, 5: no FIFO
    for thread in threads:
        thread.join(timeout=60)  # it wakes on the byte already sent: 60 s for a loaded machine
        assert not thread.is_alive()


def test_collect_waits_for_each_asked_rank_and_no_longer(tmp_path):
    control, run = folders(tmp_path)
    for rank in (0, 1):
        flight_recorder.listen(control, run, rank)
    stale = run.dump(1)
    stale.write_text("{}")  # from an earlier request: must not count for this one

    def answer(rank, delay):
        def write():
            time.sleep(delay)
            target = run.dump(rank)
            target.with_suffix(".tmp").write_text('{"recorders": {}}')
            os.replace(target.with_suffix(".tmp"), target)

        return write

    reader(control.dump_request(0), answer(0, 0.2))
    reader(control.dump_request(1), answer(1, 0.6))
    started = time.monotonic()
    landed = flight_recorder.collect(control, run, [0, 1], timeout=60.0)
    took = time.monotonic() - started
    assert set(landed) == {0, 1}
    assert 0.6 <= took < 30.0, took  # not the 60-s bound, however busy the machine

    reader(control.dump_request(0))  # listens, never answers (its GIL never comes back)
    started = time.monotonic()
    assert flight_recorder.collect(control, run, [0], timeout=0.5) == {}
    assert time.monotonic() - started < 30.0  # its 0.5 s bound, however busy the machine


def test_a_rank_that_can_no_longer_answer_keeps_the_dump_it_wrote_before(tmp_path):
    """A dying rank's wrapper asks its peers for their records before torchrun ends them;
    the bootstrap asks again later, when some are gone: their earlier dumps must stay."""
    control, run = folders(tmp_path)
    flight_recorder.listen(control, run, 3)
    run.dump(3).write_text('{"recorders": {"generic": {"entries": []}}}')
    assert flight_recorder.collect(control, run, [3], timeout=0.2) == {}  # nobody listens
    assert run.dump(3).read_text() == '{"recorders": {"generic": {"entries": []}}}'


def ended(control, run, rank, *, died: bool, dump_first: bool = False) -> None:
    """The rank's script ended, as _site/sitecustomize.py notes it: the end's mark, then (of an
    exception) the dump of its death. `dump_first`: a death dump of an earlier attempt."""
    if dump_first:
        run.death_dump(rank).write_text('{"recorders": {"old": {}}}')
        time.sleep(0.05)  # the filesystem's timestamps: the mark is newer
    control.exiting(rank).write_text(repr(time.time()))
    if died:
        run.death_dump(rank).with_suffix(".tmp").write_text('{"recorders": {"generic": {}}}')
        os.replace(run.death_dump(rank).with_suffix(".tmp"), run.death_dump(rank))


def test_a_rank_in_its_exit_answers_with_the_dump_of_its_death_at_once(tmp_path):
    """Every state a rank can be in when asked, its FIFO still open (a rank in its exit keeps
    it: its dump thread never runs again). A collective timeout on two hosts: every rank died
    of it at once, and waiting the whole bound for them held this host's records past the
    master's wait for them (run 93: the culprit named the other host's ranks alone)."""
    control, run = folders(tmp_path)
    for rank in range(5):
        flight_recorder.listen(control, run, rank)
    ended(control, run, 0, died=True)  # died of an exception before the request
    ended(control, run, 1, died=False)  # the dump of its death lands while it is asked...
    ended(control, run, 2, died=False)  # ended without an exception: nothing at its death
    ended(control, run, 3, died=False, dump_first=True)  # an earlier attempt's death dump
    ended(control, run, 4, died=True)  # gone: nobody listens on its FIFO any more
    for rank in range(4):
        reader(control.dump_request(rank))  # open, never answering

    def dies_later() -> None:
        time.sleep(0.3)
        ended(control, run, 1, died=True)

    threading.Thread(target=dies_later, daemon=True).start()
    started = time.monotonic()
    landed = flight_recorder.collect(control, run, [0, 1, 4], timeout=60.0)
    assert landed == {rank: run.death_dump(rank) for rank in (0, 1, 4)}
    assert time.monotonic() - started < 30.0  # not the 60-s bound, however busy the machine

    # no dump of this attempt's death: asked, waited for until the bound, not taken
    assert flight_recorder.collect(control, run, [2, 3], timeout=0.5) == {}
