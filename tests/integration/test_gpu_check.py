"""The GPU check (scripts/gpu/check.py) on gloo: its scenarios keep working on machines without
a GPU, so the command a GPU host runs has not rotted when one is found.

One run of `python -m scripts.gpu.check --device cpu` for the module (about 40 s), in a private
mount namespace whose /etc/hosts resolves algo-1 (the machine's file is untouched); each
scenario's line is its own test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, with_hosts_file

SCENARIOS = ("plan", "crash", "oom", "hang", "stop", "fr-fields")
CHECKPOINT_SECONDS = 3


@pytest.fixture(scope="module")
def check(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("the GPU check's self-test needs root and unshare (CI runs as root)")
    root = tmp_path_factory.mktemp("gpu-check")
    hosts = root / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.0.1 algo-1\n")
    table = root / "table.md"
    argv = [
        sys.executable, "-m", "scripts.gpu.check", "--device", "cpu",
        "--only", ",".join(SCENARIOS), "--checkpoint-seconds", str(CHECKPOINT_SECONDS),
        "--work", str(root / "work"), "--markdown", str(table),
    ]  # fmt: skip
    done = subprocess.run(
        with_hosts_file(argv, hosts),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done, table


def scenario_line(output: str, name: str) -> str:
    lines = [line for line in output.splitlines() if line.split(" ", 1)[0] == name]
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_scenario_is_ok_on_gloo(check, name):
    done, _ = check
    line = scenario_line(done.stdout, name)
    assert line.split()[1] == "ok", f"{line}\n--- output:\n{done.stdout}\n{done.stderr[-3000:]}"


def test_the_stop_line_gives_the_measured_figures(check):
    line = scenario_line(check[0].stdout, "stop")
    for part in ("exit 143", "after SIGTERM", "bootstrap gone", "nothing left"):
        assert part in line, line


def test_the_hang_line_names_the_flight_recorder_entries(check):
    line = scenario_line(check[0].stdout, "hang")
    assert "exit 124" in line and "flight recorder rank 0 entries: generic" in line, line


def test_the_fr_fields_line_names_the_fields_gloo_records(check):
    line = scenario_line(check[0].stdout, "fr-fields")
    assert "generic: process_group, collective_seq_id, time_created_ns on 40" in line, line


def test_exit_code_and_summary_and_markdown_table(check):
    done, table = check
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"{len(SCENARIOS)} ok, 0 FAIL, 0 skipped" in done.stdout, done.stdout
    text = table.read_text()
    assert "device `cpu`" in text and "torch " in text, text
    for name in SCENARIOS:
        assert f"| {name} | ok |" in text, text
