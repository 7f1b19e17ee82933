"""The rank record: one typed schema for what a worker writes, the monitor reads, the master
relays and the failure file names."""

from __future__ import annotations

import json

import pytest

from container_entry.records import RankRecord, read_json, write_json


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
