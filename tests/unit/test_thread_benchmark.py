"""The thread benchmark's page (scripts/bench/threads.py) from fake measurements: the page it
writes, the shared-machine section it keeps, and that section's generated block; the runs
themselves are `make bench-threads`'s."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

from scripts.bench import threads as thread_benchmark

SNAPSHOT = Path(__file__).parent / "snapshots" / "thread-benchmark.md"


class Day(dt.date):
    @classmethod
    def today(cls) -> dt.date:
        return dt.date(2026, 12, 2)


def test_the_page_renders_as_the_snapshot(tmp_path, monkeypatch, capsys):
    """Both runs (alone, then hosts sharing the machine) write the page, byte for byte;
    regenerate after a deliberate change with UPDATE_SNAPSHOTS=1 and review the diff."""
    rates = iter([4.5, 3.0, 9.25, 6.5, 4.75, 3.1, 9.0, 6.0, 4.4, 2.9, 9.5, 6.25])
    shared = iter([1.5, 1.25, 2.0, 1.0, 1.75, 1.5, 2.5, 1.25])
    monkeypatch.setattr(thread_benchmark, "run_once", lambda *_: next(rates))
    monkeypatch.setattr(
        thread_benchmark,
        "threads_in_plan",
        lambda extra, _: f"{extra['OMP_NUM_THREADS']} (user)" if extra else "2 (bootstrap)",
    )
    monkeypatch.setattr(
        thread_benchmark,
        "shared_once",
        lambda _image, extra, *_: (next(shared), extra.get("OMP_NUM_THREADS") or "1"),
    )
    monkeypatch.setattr(thread_benchmark.dt, "date", Day)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    page = tmp_path / "thread-benchmark.md"
    page.write_text(
        f"# old page\n\nold table\n\n{thread_benchmark.SHARED_HEADING}\n\nhand text\n\n"
        f"{thread_benchmark.SHARED_BEGIN}\nold\n{thread_benchmark.SHARED_END}\n"
    )
    common = ["--batch-sizes", "8,64", "--out", str(page)]
    monkeypatch.setattr(sys, "argv", ["thread_benchmark", "--rounds", "3", *common])
    assert thread_benchmark.main() == 0
    shared_run = ["--rounds", "2", *common, "--shared-image", "container-entry:bench"]
    monkeypatch.setattr(sys, "argv", ["thread_benchmark", *shared_run])
    assert thread_benchmark.main() == 0
    printed = capsys.readouterr().out
    assert "round 3 batch  64 torchrun    6.25 steps/s" in printed
    assert "round 2 batch   8 per-host    1.75 steps/s (OMP_NUM_THREADS=2)" in printed
    text = page.read_text()
    if os.environ.get("UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text(), f"page changed: UPDATE_SNAPSHOTS=1 and review {SNAPSHOT}"
