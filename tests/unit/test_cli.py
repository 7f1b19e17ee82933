"""The command dispatch: help, plan's JSON and exit codes, a command that does not exist, and
the last-resort report of a defect of ours (one line, a failure file, exit 70)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from container_entry import cli
from container_entry.common.errors import ConfigError, StopRequested
from container_entry.common.stopping import STOP_SIGNALS, Stop
from container_entry.plan import settings


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


def _cut_in_set_name() -> None:
    class Descriptor:
        def __set_name__(self, owner: type, name: str) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises inside __set_name__

    type("Owner", (), {"field": Descriptor()})


def _cut_then_reraised_as_another_error() -> None:
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    except Exception as error:  # what a library's broad handler does
        raise ValueError(f"could not read the config: {error}") from None


def _cut_then_swallowed_and_failing_later() -> None:
    try:  # noqa: SIM105 (spelled as the code a stop cuts spells it)
        os.kill(os.getpid(), signal.SIGTERM)
    except Exception:
        pass
    raise AttributeError("module 'half' has no attribute 'imported'")


def _cut_in_an_import(tmp_path: Path) -> None:
    module = tmp_path / "cut_module.py"
    module.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\nVALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import cut_module  # noqa: F401
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cut_module", None)


def _cut_then_a_config_error() -> None:
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    except Exception as error:
        raise ConfigError(f"/opt/ml/input/config/hyperparameters.json: {error}") from None


@pytest.mark.parametrize(
    "cut",
    [
        _cut_in_set_name,
        _cut_then_reraised_as_another_error,
        _cut_then_swallowed_and_failing_later,
        _cut_in_an_import,
        _cut_then_a_config_error,
    ],
)
def test_a_stop_reshaped_by_the_code_it_cut_is_still_a_stopped_job(
    tmp_path, monkeypatch, capsys, cut
):
    """The stop's exception is raised wherever the main thread is; the code it cuts may turn it
    into another error (3.11's `Error calling __set_name__`, a library's broad `except`, a
    half-imported module). Any error after a stop before the workers is that stop: 143, a
    failure file that says stopped (CI once saw exit 70, an internal error, 5 ms into a stop)."""
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path))
    stop = Stop()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def run(_args):
        stop.install()
        if cut is _cut_in_an_import:
            cut(tmp_path)
        else:
            cut()
        return 0

    try:
        assert cli._guarded("train", run, [], stop) == 143
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err
    failure = (tmp_path / "output" / "failure").read_text()
    assert failure == "StopRequested: stopped by SIGTERM before the workers started\n"


def test_a_defect_with_no_stop_is_still_an_internal_error(tmp_path, monkeypatch):
    """The rule above only covers errors after a stop: without one, a defect stays a defect."""
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path))
    stop = Stop()

    def broken(_args):
        raise RuntimeError("Error calling __set_name__ on 'cached_property' instance 'hosts'")

    assert cli._guarded("train", broken, [], stop) == 70
