"""The launcher's side of flight-recorder dumps: a request reaches each listening rank's FIFO,
skips a rank nobody listens for, and the wait ends as soon as every asked rank's file landed
(or at the bound). The rank's side, a real Python with torch, is tests/integration."""

from __future__ import annotations

import os
import threading
import time

from container_entry import flight_recorder


def reader(path, then=None):
    """A rank's dump thread in miniature: block on the FIFO, then answer."""

    def serve():
        with open(path, "rb") as fifo:
            fifo.read()
        if then:
            then()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    time.sleep(0.05)  # blocked in open() before the request
    return thread


def test_a_request_reaches_listening_ranks_and_skips_the_others(tmp_path):
    control, run_dir = tmp_path / "control", tmp_path / "run"
    control.mkdir()
    for rank in (0, 1, 2):
        env = flight_recorder.listen(control, run_dir, rank)
        assert env[flight_recorder.REQUEST_ENV] == str(control / f"dump-rank-{rank}.fifo")
    threads = [reader(control / f"dump-rank-{rank}.fifo") for rank in (0, 2)]
    assert flight_recorder.request(control, [0, 1, 2, 5]) == [0, 2]  # 1: no reader, 5: no FIFO
    for thread in threads:
        thread.join(timeout=5)
        assert not thread.is_alive()


def test_collect_waits_for_each_asked_rank_and_no_longer(tmp_path):
    control, run_dir = tmp_path / "control", tmp_path / "run"
    control.mkdir()
    for rank in (0, 1):
        flight_recorder.listen(control, run_dir, rank)
    stale = flight_recorder.dump_path(run_dir, 1)
    stale.write_text("{}")  # from an earlier request: must not count for this one

    def answer(rank, delay):
        def write():
            time.sleep(delay)
            target = flight_recorder.dump_path(run_dir, rank)
            target.with_suffix(".tmp").write_text('{"recorders": {}}')
            os.replace(target.with_suffix(".tmp"), target)

        return write

    reader(control / "dump-rank-0.fifo", answer(0, 0.2))
    reader(control / "dump-rank-1.fifo", answer(1, 0.6))
    started = time.monotonic()
    landed = flight_recorder.collect(control, run_dir, [0, 1], timeout=5.0)
    took = time.monotonic() - started
    assert set(landed) == {0, 1}
    assert 0.6 <= took < 2.0, took

    reader(control / "dump-rank-0.fifo")  # listens, never answers (its GIL never comes back)
    started = time.monotonic()
    assert flight_recorder.collect(control, run_dir, [0], timeout=0.5) == {}
    assert time.monotonic() - started < 1.5
