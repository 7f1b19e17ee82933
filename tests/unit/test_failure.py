from container_entry.common.records import RankRecord
from container_entry.diagnose.failure import describe_rank, hint, where
from container_entry.rank.rank_end import parse_exception


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
