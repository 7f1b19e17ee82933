"""The GPU check's judgements (scripts/gpu/scenarios.py): exit 134 passes only where the rank
printed the planted traceback and torch then aborted its exit; fr-fields (scripts/gpu/fr_fields.py)
passes only records that carry what the straggler analysis reads."""

from __future__ import annotations

import json
import os
import re

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


# fr-fields: the flight recorder's records carry what the straggler analysis reads

COUNT = 20  # fr_probe.py's collectives per group


def nccl_entry(seq, group, duration=None, **changes):
    from tests.unit.test_culprit import entry

    found = {**entry(seq, group=group), "record_id": seq + (100 if group[0] != "0" else 0)}
    if duration is not None:
        found["duration_ms"] = duration
    return {**found, **changes}


def probe_dump(recorder="nccl", timed_duration=0.05, untimed_duration=None, drop=(), **changes):
    """fr_probe.py's dump: 20 collectives untimed in the default group, 20 in "timed"; the last
    record changed by `changes`, its fields `drop` left out."""
    entries = [nccl_entry(s, ("0", "default_pg"), untimed_duration) for s in range(1, COUNT + 1)]
    entries += [nccl_entry(s, ("1", "timed"), timed_duration) for s in range(1, COUNT + 1)]
    last = {k: v for k, v in {**entries[-1], **changes}.items() if k not in drop}
    entries[-1] = last
    return {"recorders": {recorder: {"entries": entries, "pg_config": {}}}}


def test_fr_fields_passes_nccl_records_timed_where_the_variable_was_set():
    from scripts.gpu.fr_fields import judge

    detail = judge(probe_dump(), "cuda")
    assert "nccl: process_group, collective_seq_id, time_created_ns on 40" in detail
    assert "duration_ms on 20/20 with TORCH_NCCL_ENABLE_TIMING=1 (median 0.050 ms)" in detail
    assert detail.endswith("0/20 without")
    gloo = judge(probe_dump("generic", timed_duration=None), "cpu")
    assert gloo.startswith("generic: process_group") and "gloo fills none" in gloo


BROKEN = {
    "untimed": (probe_dump(timed_duration=None), "duration_ms on 0 of 20 with TORCH_NCCL_ENABL"),
    "one-missing": (probe_dump(drop=("duration_ms",)), "duration_ms on 19 of 20"),
    "untimed-has": (probe_dump(untimed_duration=0.1), "duration_ms without TORCH_NCCL_ENABLE"),
    "no-time": (probe_dump(drop=("time_created_ns",)), "group 1 #20: time_created_ns None"),
    "not-epoch": (probe_dump(time_created_ns=12345), "group 1 #20: time_created_ns 12345"),
    "gap": (probe_dump(collective_seq_id=22), "group 1's sequence numbers"),
    "running": (probe_dump(retired=False, state="started"), "summarize kept 19 of group 1's"),
    "no-group": (probe_dump(process_group=None), "a record without process_group"),
    "recorder": (probe_dump("generic"), "no nccl recorder in the dump"),
    "empty": ({"recorders": {"nccl": {"entries": []}}}, "groups recorded: []"),
}


@pytest.mark.parametrize(("dump", "reason"), BROKEN.values(), ids=BROKEN.keys())
def test_fr_fields_fails_naming_the_field_the_analysis_would_miss(dump, reason):
    from scripts.gpu.fr_fields import judge
    from scripts.gpu.jobs import Failed

    with pytest.raises(Failed, match=re.escape(reason)):
        judge(dump, "cuda")


def fake_python(tmp_path, stdout, code=0, stderr=""):
    """A `python` that prints what fr_probe.py would have printed (the check's plumbing)."""
    (tmp_path / "out").write_text(stdout)
    (tmp_path / "err").write_text(stderr)
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\ncat "{tmp_path}/out"\ncat "{tmp_path}/err" >&2\nexit {code}\n')
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    ("stdout", "code", "verdict", "said"),
    [
        ("noise\nFR " + json.dumps(probe_dump()) + "\n", 0, "ok", "duration_ms on 20/20"),
        ("", 1, "FAIL", "fr_probe.py exit 1: RuntimeError: NCCL error"),
        ("nothing\n", 0, "FAIL", "fr_probe.py printed no FR line"),
        ("FR {not json\n", 0, "FAIL", "the FR line is not JSON"),
    ],
    ids=["ok", "exit", "no-line", "not-json"],
)
def test_the_fr_fields_scenario_runs_the_probe_and_judges_its_line(
    tmp_path, stdout, code, verdict, said
):
    from scripts.gpu.check import NEEDS_HOSTS, selected
    from scripts.gpu.jobs import Context
    from scripts.gpu.scenarios import SCENARIOS, run_scenario

    assert "fr-fields" in SCENARIOS and "fr-fields" not in NEEDS_HOSTS
    assert selected("hang,fr-fields") == ["hang", "fr-fields"]
    python = fake_python(tmp_path, stdout, code, "Traceback\nRuntimeError: NCCL error\n")
    env = {"PATH": os.environ.get("PATH", "")}
    ctx = Context("cuda", 1, tmp_path / "work", python, 1.0, "lo", env)
    result = run_scenario(ctx, "fr-fields")
    assert (result.verdict, said in result.detail) == (verdict, True), result.detail
