"""The command dispatch: help, plan's JSON and exit codes, a command that does not exist, and
the last-resort report of a defect of ours (one line, a failure file, exit 70)."""

from __future__ import annotations

import json
from pathlib import Path

from container_entry import cli, settings


def test_help_is_the_usage_with_every_setting(capsys):
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: container-entry")
    for name, _, _ in settings.table():
        assert f"  {name} " in text


def test_plan_prints_json_and_exits_2_naming_a_problem(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path))
    monkeypatch.setenv("CONTAINER_ENTRY_HANG_TIMEOUT", "-5")
    assert cli.main(["plan", "train.py"]) == 2
    out, err = capsys.readouterr()
    problems = json.loads(out)["problems"]
    assert len(problems) == 1 and "CONTAINER_ENTRY_HANG_TIMEOUT='-5'" in problems[0]
    assert err.startswith("[container-entry] error: CONTAINER_ENTRY_HANG_TIMEOUT")


def test_a_command_that_cannot_run_is_127_naming_it(capsys):
    assert cli.main(["no-such-command-xyz", "--flag"]) == 127
    assert "cannot run 'no-such-command-xyz'" in capsys.readouterr().err


def test_a_defect_of_ours_is_one_line_a_failure_file_and_exit_70(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path))

    def broken(_args):
        raise KeyError("planted")

    assert cli._guarded("train", broken, []) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: KeyError: 'planted'" in err
    assert "Traceback" not in err
    failure = (tmp_path / "output" / "failure").read_text().splitlines()
    assert failure[0] == "internal error: KeyError: 'planted'"
    traceback_file = failure[1].removeprefix("traceback: ")
    assert "KeyError" in Path(traceback_file).read_text()
