"""The script's process groups are destroyed at its exit (_site/sitecustomize.py), through the
real bootstrap, torchrun and worker wrapper, on the newest torch (2.15, its own venv: left to
Python's finalization, its gloo worker threads aborted the process in about one run in two
of a plain two-rank script, `terminate called without an active exception`, and once failed
the restart test's finished job). A destroy_process_group wrapped by the script (exit_probe.py)
says when it was called, by which process, and what had run by then."""

from __future__ import annotations

import json
import time

import pytest

from container_entry.common.layout import RunDir
from tests.integration.conftest import REPO, bootstrap_argv, bootstrap_env, make_tree, run

PROBE = REPO / "tests" / "scripts" / "exit_probe.py"
ABORT = "terminate called without an active exception"


def _job(
    tmp_path, python: str, how: str, ranks: int, more: dict[str, str] | None = None, **env: str
):
    tree = make_tree(tmp_path, script=PROBE)
    out = tmp_path / "calls"
    out.mkdir()
    hyperparameters = {
        "how": how,
        "out": str(out),
        "death-dump": str(RunDir.of(tree.base).death_dump(0)),
        **(more or {}),
    }
    (tree.base / "input/config/hyperparameters.json").write_text(json.dumps(hyperparameters))
    began = time.monotonic()
    done = run(
        bootstrap_argv(python=python),
        bootstrap_env(tree, SAGEMAKER_PROGRAM=PROBE.name, PET_NPROC_PER_NODE=str(ranks), **env),
    )
    calls = {path.name: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}
    return tree, done, calls, time.monotonic() - began


@pytest.mark.parametrize(
    ("how", "ranks", "code", "first"),
    [
        ("return,exit0,fork", 3, 0, None),  # the ways to succeed, one per rank
        ("exit3", 1, 3, "rank 0 (local 0) on algo-1: exit code 3"),
        ("raise", 1, 1, "rank 0 (local 0) on algo-1: exit code 1: ValueError: planted at the end"),
    ],
)
def test_every_way_a_script_exits_ends_its_groups_once_after_its_own_exit_handlers(
    newest_python, tmp_path, how, ranks, code, first
):
    tree, done, calls, _ = _job(tmp_path, newest_python, how, ranks)
    output = done.stdout + done.stderr
    assert done.returncode == code, output[-3000:]
    assert ABORT not in output
    # once per rank, by the rank itself (a forked child's exit never ends its parent's groups)
    assert sorted(calls) == sorted(
        f"calls-rank-{rank}-{call['pid']}.json" for rank, call in enumerate(calls.values())
    )
    assert len(calls) == ranks, calls
    for call in calls.values():
        assert call["initialized_before"] and call["initialized_after"] is False, call
        assert call["handler_sum"] == ranks, call  # its own handler ran first, with the group
        assert call["death_dump_existed"] is (how == "raise"), call  # the dump came first
    if first is None:
        assert not (tree.output / "failure").exists()
    else:
        assert (tree.output / "failure").read_text().startswith(first)


def test_a_teardown_that_never_returns_holds_the_exit_only_its_timeout_and_says_so(
    newest_python, tmp_path
):
    _, done, calls, took = _job(
        tmp_path, newest_python, "stuck", 1, CONTAINER_ENTRY_GROUP_TEARDOWN_TIMEOUT="1"
    )
    output = done.stdout + done.stderr
    assert "the process groups' teardown at exit took over 1 s; exiting without it" in output
    assert len(calls) == 1 and "initialized_after" not in next(iter(calls.values()))
    assert took < 60, took  # not the hour the teardown sleeps
    # the exit then goes on as it would have without the teardown: torch may abort in it
    assert done.returncode == 0 or (done.returncode == 134 and ABORT in output), output[-3000:]


def test_a_timeout_of_0_leaves_the_groups_to_the_script_as_before(newest_python, tmp_path):
    _, done, calls, _ = _job(
        tmp_path, newest_python, "exit0", 1, CONTAINER_ENTRY_GROUP_TEARDOWN_TIMEOUT="0"
    )
    output = done.stdout + done.stderr
    assert calls == {}
    assert done.returncode == 0 or (done.returncode == 134 and ABORT in output), output[-3000:]


def test_a_rank_that_exits_with_an_error_is_the_first_failure_though_its_exit_outlasts_its_peers(
    newest_python,
    tmp_path,
):
    """The teardown closes the rank's sockets before its process ends: its peers fail on them
    ("Connection closed by peer") and their records come first, and the launcher stops the
    host, this rank in its exit too. The failure began when its exit did (the wrapper reads
    when the teardown began), and its exit status stays its own."""
    # rank 1's exit lasts until rank 0's failure is recorded (its record: its traceback read),
    # then 0.5 s for the launcher to stop the host meanwhile: a fixed 2 s lost the order when
    # rank 0 was stalled (rank 1 exited first, rank 0 was stopped before its traceback). That
    # wait runs inside rank 1's teardown, so its bound (10 s by default) is raised past the
    # probe's own 30-s cap: a loaded machine's slow peer is no teardown that never returns
    record = RunDir.of(tmp_path / "algo-1" / "ml").record(0)  # make_tree's folder
    more = {"only-rank": "1", "after-peer": str(record), "after-teardown": "0.5"}
    tree, done, _, _ = _job(
        tmp_path, newest_python, "exit3", 2, more, CONTAINER_ENTRY_GROUP_TEARDOWN_TIMEOUT="60"
    )
    assert RunDir.of(tree.base).record(0) == record
    output = done.stdout + done.stderr
    assert done.returncode == 3, output[-3000:]
    failure = (tree.output / "failure").read_text()
    assert failure.startswith("rank 1 (local 1) on algo-1: exit code 3"), failure[:500]
    assert "Connection closed by peer" in failure  # rank 0's, as a consequence
