"""The GPU check's judgement of a planted failure (scripts/gpu/scenarios.py): exit 134 passes
only where the rank printed the planted traceback and torch then aborted its exit."""

from __future__ import annotations

import pytest

from scripts.gpu.jobs import run_dir
from scripts.gpu.scenarios import EXIT_ABORT, aborted_at_exit

WANTED = "ValueError: planted failure"
TRACEBACK = f"[rank0]: Traceback (most recent call last):\n[rank0]: {WANTED} after an all_reduce\n"


@pytest.mark.parametrize(
    ("logs", "expected"),
    [
        ({"rank-0.log": TRACEBACK + EXIT_ABORT + "\nFatal Python error: Aborted\n"}, True),
        ({"rank-0.log": "ok\n", "rank-1.log": TRACEBACK + EXIT_ABORT + "\n"}, True),
        ({"rank-0.log": TRACEBACK}, False),  # exited 134 for another reason
        ({"rank-0.log": EXIT_ABORT + "\n" + TRACEBACK}, False),  # the abort came first
        ({"rank-0.log": "Traceback\nRuntimeError: other\n" + EXIT_ABORT}, False),
        ({"rank-0.log": TRACEBACK, "rank-1.log": EXIT_ABORT}, False),  # not the same rank
        ({}, False),
    ],
    ids=["after", "another-rank", "no-abort", "abort-first", "other-error", "split", "no-logs"],
)
def test_exit_134_is_accepted_only_after_the_planted_traceback(tmp_path, logs, expected):
    folder = run_dir(tmp_path) / "logs"
    folder.mkdir(parents=True)
    for name, text in logs.items():
        (folder / name).write_text(text)
    assert aborted_at_exit(tmp_path, WANTED) is expected
