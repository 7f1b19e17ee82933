"""The rank record: one typed schema for what a worker writes, the monitor reads, the master
relays and the failure file names."""

from __future__ import annotations

import json

import pytest

from container_entry.common.records import Command, RankRecord, WorkerPids, read_json, write_json
from container_entry.common.stopping import StopSignal


def test_a_record_survives_json_and_the_relay_keeps_only_what_names_the_failure(tmp_path):
    record = RankRecord(
        host="algo-2",
        rank=3,
        local_rank=1,
        returncode=1,
        exception={"type": "ValueError", "message": "planted"},
        started_at=1.0,
        ended_at=2.0,
        stderr_tail=["Traceback ...", "ValueError: planted"],
        log="/opt/ml/output/data/container-entry/logs/rank-3.log",
    )
    write_json(tmp_path / "rank-3.json", record.to_json())
    assert RankRecord.from_json(read_json(tmp_path / "rank-3.json")) == record
    relayed = record.relayed()
    assert "stderr_tail" not in relayed and "log" not in relayed
    assert RankRecord.from_json(relayed).exception == record.exception
    assert record.failed and not RankRecord(host="algo-1", rank=0).failed


def test_unknown_keys_from_a_newer_writer_are_ignored():
    data = {"host": "algo-1", "rank": 0, "returncode": 0, "added_in_a_later_version": 1}
    assert RankRecord.from_json(data) == RankRecord(host="algo-1", rank=0)


def test_a_half_written_or_foreign_file_reads_as_nothing(tmp_path):
    (tmp_path / "half.json").write_text('{"rank": 1,')
    (tmp_path / "list.json").write_text(json.dumps([1, 2]))
    assert read_json(tmp_path / "half.json") is None
    assert read_json(tmp_path / "list.json") is None
    assert read_json(tmp_path / "missing.json") is None


def test_writes_are_atomic_no_temporary_file_is_left(tmp_path):
    for step in range(20):
        write_json(tmp_path / "rank-0.json", {"step": step})
    assert [p.name for p in tmp_path.iterdir()] == ["rank-0.json"]
    assert read_json(tmp_path / "rank-0.json") == {"step": 19}


def test_what_stopped_on_this_host_stays_in_its_record(tmp_path):
    record = RankRecord(
        host="algo-1",
        rank=0,
        log_error="rank log /x/rank-0.log stopped at 1,024 bytes: No space left on device",
        console_error="console (stdout) stopped: Broken pipe",
    )
    write_json(tmp_path / "rank-0.json", record.to_json())
    assert RankRecord.from_json(read_json(tmp_path / "rank-0.json")) == record
    assert not {"log_error", "console_error"} & set(record.relayed())


def test_a_write_that_fails_leaves_nothing_behind(tmp_path):
    folder = tmp_path / "gone"
    with pytest.raises(OSError):
        write_json(folder / "rank-0.json", {"rank": 0})
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "rank-0.json").mkdir()  # the rename fails: the temporary file goes
    with pytest.raises(OSError):
        write_json(tmp_path / "ro" / "rank-0.json", {"rank": 0})
    assert [p.name for p in (tmp_path / "ro").iterdir()] == ["rank-0.json"]


def test_the_command_file_round_trips_is_private_and_says_which_ranks_show(tmp_path):
    command = Command(
        argv=("train.py", "--lr", "0.1", "caf\udce9"),
        run_dir="/opt/ml/output/data/container-entry",
        preflight=("check.py",),
        console_ranks=(0, 2),
        secrets=("s3cret",),
        console_stderr="/proc/1/fd/2",
        group_teardown_seconds=2.5,
    )
    path = tmp_path / "command.json"
    command.write(path)
    assert Command.read(path) == command
    assert path.stat().st_mode & 0o777 == 0o600
    assert [rank for rank in range(4) if command.shows(rank)] == [0, 2]
    assert Command(argv=("train.py",), run_dir="/run").shows(7)  # None: every rank


@pytest.mark.parametrize(
    ("written", "ranks"),
    [(None, None), ([1, 3], (1, 3)), ("all", None), ("2,0", (0, 2))],
)
def test_the_ranks_shown_are_read_as_ranks_or_as_the_setting_s_text(tmp_path, written, ranks):
    data = {"argv": ["train.py"], "run_dir": "/run", "console_ranks": written}
    (tmp_path / "command.json").write_text(json.dumps(data))
    assert Command.read(tmp_path / "command.json").console_ranks == ranks


@pytest.mark.parametrize(
    "text",
    [
        '{"argv": ["train.py"]',
        '["train.py"]',
        '{"run_dir": "/run"}',
        '{"argv": ["train.py"]}',
        '{"argv": ["train.py"], "run_dir": "/run", "preflight": 3}',
        '{"argv": ["train.py"], "run_dir": "/run", "console_ranks": "some"}',
    ],
)
def test_a_file_that_is_no_command_is_a_value_error(tmp_path, text):
    (tmp_path / "command.json").write_text(text)
    with pytest.raises(ValueError):
        Command.read(tmp_path / "command.json")


def test_a_pid_file_round_trips_and_a_foreign_one_reads_as_nothing(tmp_path):
    pids = WorkerPids(rank=3, wrapper=100, child=101, host="algo-2")
    pids.write(tmp_path / "rank-3.pid")
    assert WorkerPids.read(tmp_path / "rank-3.pid") == pids
    (tmp_path / "other.pid").write_text(json.dumps({"rank": 1, "wrapper": "x", "child": 2}))
    assert WorkerPids.read(tmp_path / "other.pid") is None
    assert WorkerPids.read(tmp_path / "missing.pid") is None


@pytest.mark.parametrize(
    ("returncode", "stop", "failed_at", "own"),
    [
        (0, None, None, False),  # no failure
        (0, ("SIGTERM", 9.0), 5.0, False),
        (3, None, None, True),  # no stop: its own
        (1, None, 5.0, True),
        (3, ("SIGTERM", 9.0), 5.0, True),  # its exit began before the stop reached it
        (1, ("SIGTERM", 9.0), 8.999, True),
        (1, ("SIGTERM", 9.0), 9.0, False),  # a traceback the stop caused (KeyboardInterrupt)
        (1, ("SIGINT", 9.0), 9.5, False),
        (-15, ("SIGTERM", 9.0), None, False),  # ended by the stop, nothing began before it
        (-15, ("SIGTERM", 9.0), 5.0, False),  # began first, but the stop ended its exit: no
        (-9, ("SIGTERM", 9.0), 5.0, False),  # status of its own (a peer names the failure)
    ],
)
def test_a_failure_is_a_rank_s_own_unless_a_stop_reached_it_first(returncode, stop, failed_at, own):
    record = RankRecord(
        host="algo-1",
        rank=1,
        returncode=returncode,
        stop=StopSignal(*stop) if stop else None,
        failed_at=failed_at,
        ended_at=20.0,
    )
    assert record.failed_on_its_own is own
