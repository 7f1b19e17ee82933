"""What a rank's script ended with (container_entry.supervise.outcome): its record written on a
full disk, an entry script that could not start named in one line."""

from __future__ import annotations

import errno
import os

import pytest

from container_entry.rank import rank_end


def test_a_record_is_written_on_a_full_disk_with_the_reserved_space(tmp_path, monkeypatch):
    """ENOSPC for the record: the reserve is given back and the write tried again, then once
    more without the stderr tail; never a crash of the wrapper."""
    attempts: list[dict] = []
    real = rank_end.write_json

    def full(path, data):
        attempts.append(data)
        if len(attempts) < 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(rank_end, "write_json", full)
    reserve = rank_end.reserve_space(tmp_path)
    assert reserve is not None and os.fstat(reserve).st_blocks * 512 >= rank_end.RESERVE_BYTES
    assert not [p for p in tmp_path.iterdir()]  # unlinked: nothing left behind, ever
    record = {"rank": 0, "stderr_tail": ["x"] * 5, "last_words": "x"}
    assert rank_end.save_record(tmp_path / "rank-0.json", record, reserve) is None
    assert [len(a["stderr_tail"]) for a in attempts] == [5, 5, 0]
    with pytest.raises(OSError):
        os.fstat(reserve)  # given back
    monkeypatch.setattr(rank_end, "write_json", lambda *_: (_ for _ in ()).throw(OSError(5, "EIO")))
    problem = rank_end.save_record(tmp_path / "rank-1.json", record, None)
    assert problem == f"rank record {tmp_path}/rank-1.json not written: EIO"


@pytest.mark.parametrize(
    "name", [os.fsdecode(b"donn\xe9es.sh"), "new\nline.sh", "x\ud800.py"], ids=ascii
)
def test_an_entry_script_with_an_odd_name_that_cannot_run_is_named_in_one_line(name):
    code, failure = rank_end.exec_failure(name, OSError(errno.ENOENT, "No such file"))
    assert code == 127 and failure["type"] == "ExecError"
    assert len(failure["message"].splitlines()) == 1
    failure["message"].encode("utf-8")
    code, failure = rank_end.exec_failure(name, ValueError("embedded null byte"))
    assert code == 126 and "cannot be passed to a program" in failure["message"]
