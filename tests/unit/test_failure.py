import signal

import pytest

from container_entry.failure import Observed, describe_rank, hint, verdict, where
from container_entry.records import RankRecord
from container_entry.worker import parse_exception


def record(**fields) -> RankRecord:
    return RankRecord(**{"host": "algo-1", "rank": 0, "local_rank": 0, **fields})


DUMP = """Thread 0x00007f1 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0 (most recent call first):
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/opt/ml/code/train.py", line 73 in step
  File "/opt/ml/code/train.py", line 90 in <module>
"""


def test_where_names_the_main_threads_innermost_frame():
    assert where(DUMP) == "train.py:73 in step, inside c10d_logger.py:81 in wrapper"
    assert where("") is None


def test_exception_parsed_from_a_chained_traceback_with_torch_rank_prefix():
    lines = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in <module>',
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "[rank3]: Traceback (most recent call last):",
        '[rank3]:   File "train.py", line 9, in <module>',
        "[rank3]:     raise RuntimeError('bad: x')",
        "[rank3]: RuntimeError: bad: x",
    ]
    assert parse_exception(lines) == {"type": "RuntimeError", "message": "bad: x"}
    assert parse_exception(["just output"]) is None


def test_hints():
    assert "out of host memory" in hint(record(returncode=-9))
    assert "segfault" in hint(record(returncode=-11))
    assert "peer rank hung" in hint(
        record(returncode=1, stderr_tail=["[Rank 0] Watchdog caught collective operation timeout"])
    )
    assert hint(record(returncode=1)) is None


def test_describe_rank_is_one_actionable_line():
    failed = record(
        rank=3,
        local_rank=1,
        host="algo-2",
        returncode=1,
        exception={"type": "ValueError", "message": "planted"},
    )
    assert describe_rank(failed) == "rank 3 (local 1) on algo-2: exit code 1: ValueError: planted"


def test_describe_rank_says_the_restarts_were_used_up():
    failed = record(returncode=1, restart_count=2)
    assert describe_rank(failed) == "rank 0 (local 0) on algo-1: exit code 1 (after 2 restarts)"


def stopped_run(signal_name: str = "SIGTERM", **fields) -> Observed:
    return Observed(stop_signal=signal_name, stop_at=100.0, grace=100.0, returncode=0, **fields)


def test_a_stop_before_any_rank_started_says_so_not_0_of_0(tmp_path):
    """A stop after torchrun was launched but before any rank's wrapper announced itself once
    read `0 of 0 local ranks exited within 0.0 s`."""
    result = verdict(stopped_run(), "algo-1", tmp_path)
    assert result.exit_code == 143
    assert result.reason.endswith("docker stop): the stop came before any rank started")
    assert "0 of 0" not in result.reason


@pytest.mark.parametrize(("name", "code"), [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_stopped_job_exits_128_plus_its_signal(tmp_path, name, code):
    ranks = {
        rank: record(rank=rank, local_rank=rank, stop_signal=name, ended_at=101.5)
        for rank in (0, 1)
    }
    run = stopped_run(name, launched={0, 1}, results=ranks)
    result = verdict(run, "algo-1", tmp_path)
    assert result.exit_code == code
    assert f"job stopped by {name} on algo-1" in result.reason
    assert result.reason.endswith("all 2 local ranks exited within 1.5 s")


def test_ranks_killed_after_the_grace_are_still_named(tmp_path):
    run = stopped_run(launched={0, 1}, results={0: record(ended_at=101.0)})
    reason = verdict(run, "algo-1", tmp_path).reason
    assert "1 of 2 local ranks exited within 1.0 s; rank 1 still running" in reason


def test_a_rank_killed_by_a_real_time_signal_is_named_and_exits_128_plus_n(tmp_path):
    number = int(signal.SIGRTMIN) + 2
    failed = record(returncode=-number, signal="SIGRTMIN+2")
    run = Observed(returncode=1, results={0: failed}, launched={0}, first_failure=failed)
    result = verdict(run, "algo-1", tmp_path)
    assert result.exit_code == 128 + number
    assert result.reason.startswith("rank 0 (local 0) on algo-1: signal SIGRTMIN+2 [first")
