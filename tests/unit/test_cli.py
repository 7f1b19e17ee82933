"""The command dispatch: help, plan's JSON and exit codes, a command that does not exist, and
the last-resort report of a defect of ours (one line, a failure file, exit 70)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from container_entry import cli, settings
from container_entry.errors import StopRequested
from container_entry.stopping import Stop


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


def test_a_defect_whose_message_holds_an_undecodable_name_is_still_reported(
    tmp_path, monkeypatch, capsys
):
    """The failure file and the traceback file were strict UTF-8: a name that is not UTF-8
    in the error ended in our own UnicodeEncodeError traceback, exit 1, an empty failure."""
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path))
    name = os.fsdecode(b"donn\xe9es\n.csv")

    def broken(_args):
        raise FileNotFoundError(f"no {name}")

    assert cli._guarded("train", broken, []) == 70
    failure = (tmp_path / "output" / "failure").read_bytes().decode("utf-8")
    assert failure.splitlines()[0] == "internal error: FileNotFoundError: no donn\\xe9es\\n.csv"
    traceback_file = Path(failure.splitlines()[1].removeprefix("traceback: "))
    assert "donn\\xe9es" in traceback_file.read_bytes().decode("utf-8")


@pytest.mark.parametrize(
    ("raised", "code", "name"),
    [
        (StopRequested("stopped by SIGINT before the workers started", "SIGINT"), 130, "SIGINT"),
        (StopRequested("stopped by SIGHUP before the workers started", "SIGHUP"), 129, "SIGHUP"),
        (KeyboardInterrupt(), 130, "SIGINT"),  # Python's own SIGINT, before any handler of ours
    ],
)
def test_a_stop_before_the_workers_is_a_failure_file_and_128_plus_n(
    tmp_path, monkeypatch, capsys, raised, code, name
):
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path))

    def stopped(_args):
        raise raised

    assert cli._guarded("train", stopped, [], Stop()) == code
    assert "Traceback" not in capsys.readouterr().err
    failure = (tmp_path / "output" / "failure").read_text()
    assert failure == f"StopRequested: stopped by {name} before the workers started\n"


def test_plan_lets_a_keyboard_interrupt_through(monkeypatch):
    def interrupted(_args):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cli._guarded("plan", interrupted, [])
