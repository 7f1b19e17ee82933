"""The hang watchdog (HANG_TIMEOUT) on real torchrun workers: one host, and two hosts on one
machine (each bootstrap in its own mount namespace resolving algo-1/algo-2), with the rank
that hangs on the other host than the master. Two local ranks per host where a test looks at
several ranks of one host (a culprit and the ranks waiting for it, a count or range of them);
one where it is about the hosts or the job's output alone (each rank is a torch import)."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.integration.conftest import REPO, control_dir, make_tree, with_hosts_file
from tests.integration.test_faults import alive, finish, first_line, start, worker_pids
from tests.ports import job_port

PROBE = REPO / "tests" / "scripts" / "hang_probe.py"
# A fixed HANG_TIMEOUT counts from the launch (docs/failure-stop-logs.md). The probe reports
# progress through its own start-up (hang_probe.starting), but not through torchrun's and the
# wrappers' before it runs: beside the other tests (make test runs 4 at a time) that took over
# 6 s (runs 4, 27)
TIMEOUT = 10
HOSTS_TIMEOUT = 10


def _start(tree, hps, timeout=TIMEOUT, **env):
    (tree.base / "code" / "fault_probe.py").write_bytes(PROBE.read_bytes())  # start() runs it
    encoded = {name: json.dumps(value) for name, value in hps.items()}  # as SageMaker writes them
    return start(tree, encoded, CONTAINER_ENTRY_HANG_TIMEOUT=str(timeout), **env)


def _failure(tree) -> str:
    return (tree.output / "failure").read_text()


@pytest.mark.parametrize(
    ("mode", "stuck_in"),
    [("deadlock", "stuck_in_python"), ("collective", "quiet_forever")],
)
def test_a_hung_rank_ends_the_job_naming_where_each_rank_was(tmp_path, mode, stuck_in):
    tree = make_tree(tmp_path, script=None)
    started = time.monotonic()
    process = _start(tree, {"mode": mode})
    returncode, _, err = finish(process, timeout=120)
    elapsed = time.monotonic() - started
    assert returncode == 124, err[-3000:]
    # the culprit first, from both ranks' flight records: rank 1 never entered the collective
    op = "barrier" if mode == "deadlock" else "all_reduce"
    line = first_line(tree)
    assert line.startswith(
        f"hung: rank 1 on algo-1 never entered {op} #2 of the default group; "
        "the 1 other rank waits in it since "
    ), line
    assert "; rank 1 was at fault_probe.py:" in line and f" in {stuck_in} (" in line, line
    assert line.endswith(f"(no output from any rank for {TIMEOUT} s)"), line
    text = _failure(tree)
    assert "rank 1 was at fault_probe.py:" in text and f"in {stuck_in}" in text, text
    assert "rank 0 was at fault_probe.py:" in text, text  # the one waiting for it, too
    assert elapsed < TIMEOUT + 40, elapsed
    assert not any(alive(pid) for pid in worker_pids(tree))
    # every rank's flight recorder, asked before the teardown and complete (gloo's records)
    dumps = tree.output / "data" / "container-entry" / "flight-recorder"
    entries = {}
    for rank in (0, 1):
        dump = json.loads((dumps / f"rank-{rank}.json").read_text())
        assert not dump["errors"], dump["errors"]
        entries[rank] = dump["recorders"]["generic"]["entries"]
    names = [e["profiling_name"] for e in entries[0]]
    assert "gloo:barrier" in names, names
    if mode == "collective":  # rank 0 waits in the all_reduce rank 1 never entered
        waiting = [e for e in entries[0] if e["profiling_name"] == "gloo:all_reduce"]
        assert waiting and not waiting[-1]["retired"], entries[0]
        assert "gloo:all_reduce" not in [e["profiling_name"] for e in entries[1]]
    # the request FIFOs went with the launcher's control folder
    assert not control_dir(process.pid).exists()


@pytest.mark.parametrize(
    "hps",
    [
        {"mode": "steady", "seconds": str(TIMEOUT * 2), "every": str(TIMEOUT / 3)},
        {"mode": "progress", "seconds": str(TIMEOUT * 2), "every": str(TIMEOUT / 3)},
    ],
    ids=["prints-slowly", "reports-progress-silently"],
)
def test_a_slow_but_steady_job_is_never_declared_hung(tmp_path, hps):
    """A line or a progress report every third of HANG_TIMEOUT for twice HANG_TIMEOUT: no
    hang. One rank: a host's life is its newest rank log or progress file, whichever rank
    wrote it (diagnose.hang.Activity)."""
    tree = make_tree(tmp_path, script=None)
    returncode, _, err = finish(_start(tree, hps, ranks=1), timeout=120)
    assert returncode == 0, err[-3000:]
    assert (tree.output / "success").exists()


def _start_hosts(tree, hps, **env):
    return _start(tree, hps, timeout=HOSTS_TIMEOUT, **env)


def _two_hosts(tmp_path, hosts_file, hps, starter=None, ranks=2):
    hosts = ("algo-1", "algo-2")
    port = str(job_port())
    trees = [make_tree(tmp_path, script=None, current_host=h, hosts=hosts) for h in hosts]
    processes = [
        (starter or _start_hosts)(
            t,
            hps,
            argv_wrap=lambda a: with_hosts_file(a, hosts_file),
            CONTAINER_ENTRY_MASTER_PORT=port,
            ranks=ranks,
        )
        for t in trees
    ]
    return trees, [finish(p, timeout=180) for p in processes]


def test_a_rank_blocked_on_one_host_ends_every_host(tmp_path, hosts_file):
    """Rank 1 (on algo-2) blocks forever without printing; rank 0 (on algo-1, the master's
    host) waits in an all_reduce. One rank per host: the check is of hosts (every host ends,
    each names the rank on the other host), no count or range of ranks of one host."""
    hps = {"mode": "collective", "rank": "1"}
    trees, results = _two_hosts(tmp_path, hosts_file, hps, ranks=1)
    for (returncode, _, err), tree in zip(results, trees, strict=True):
        assert returncode == 124, err[-3000:]
        line = first_line(tree)
        assert line.startswith(
            "hung: rank 1 on algo-2 never entered all_reduce #2 of the default group; "
        ), line
        assert line.endswith(f"(no output from any rank on any host for {HOSTS_TIMEOUT} s)"), line
        assert not any(alive(pid) for pid in worker_pids(tree))
    assert "rank 1 was at fault_probe.py:" in _failure(trees[1])
    assert "in quiet_forever" in _failure(trees[1])
    assert "rank 0 was at fault_probe.py:" in _failure(trees[0])


def test_output_on_one_host_keeps_every_host_alive(tmp_path, hosts_file):
    """algo-1's rank is silent for longer than the timeout while rank 1 on algo-2 prints:
    the job is not hung (no rank on any host is silent is the rule, not every host). One rank
    per host: the silent host and the talking one are the whole check."""
    hps = {"mode": "one-talks", "rank": "1", "seconds": str(HOSTS_TIMEOUT * 2), "every": "1"}
    trees, results = _two_hosts(tmp_path, hosts_file, hps, ranks=1)
    for (returncode, _, err), tree in zip(results, trees, strict=True):
        assert returncode == 0, err[-3000:]
        assert (tree.output / "success").exists()


@pytest.mark.parametrize(
    ("mode", "culprit"),
    [
        (
            "skip",
            "hung: rank 3 on algo-2 never entered all_reduce #5 of the default group; "
            "the 3 other ranks wait in it since ",
        ),
        (
            "desync",
            "hung: ranks disagree at collective #5: ranks 0-2 in all_reduce([4096] float32), "
            "rank 3 in broadcast([1] int64)",
        ),
    ],
)
def test_a_hang_across_hosts_names_its_culprit_first_on_every_host(
    tmp_path, hosts_file, mode, culprit
):
    """Real gloo flight-recorder records (torch 2.9+ records gloo) from both hosts, lined up at
    the master: the first line of every host's failure file names the rank on algo-2 that never
    entered the 4th all_reduce (#5, after the barrier), or the collective at which the ranks
    disagree; the per-rank lines and stacks stay below it."""
    trees, results = _two_hosts(tmp_path, hosts_file, {"mode": mode, "rank": "3"})
    for (returncode, _, err), tree in zip(results, trees, strict=True):
        assert returncode == 124, err[-3000:]
        line = first_line(tree)
        assert line.startswith(culprit), (line, err[-3000:])
        assert line.endswith(f"(no output from any rank on any host for {HOSTS_TIMEOUT} s)"), line
        if mode == "skip":  # where the culprit was, from its stack on algo-2
            assert "rank 3 was at fault_probe.py:" in line and " in evaluate" in line, line
        assert "rank 0 was at fault_probe.py:" in _failure(trees[0])  # the per-rank lines stay


@pytest.mark.parametrize("late", ["algo-1", "algo-2"])
def test_a_host_that_acts_on_the_hang_late_still_has_its_ranks_in_the_culprit(
    tmp_path, hosts_file, late
):
    """The hosts hear the verdict at different moments, and each is as slow as its machine:
    the late host's bootstrap is frozen for 3 s as soon as the other one starts its teardown
    (the master's, algo-1, with it). The ranks abort when a peer's connection breaks, as
    NCCL's do. No host ends its ranks before every host's records are in (ending them would
    abort the late host's ranks, unrecorded): every rank is counted, and the culprit's stack is
    there."""
    hosts = ("algo-1", "algo-2")
    port = str(job_port())
    trees = [make_tree(tmp_path, script=None, current_host=h, hosts=hosts) for h in hosts]
    processes = [
        _start_hosts(
            t,
            {"mode": "skip", "rank": "3", "abort-when-a-peer-dies": "1"},
            argv_wrap=lambda a: with_hosts_file(a, hosts_file),
            CONTAINER_ENTRY_MASTER_PORT=port,
        )
        for t in trees
    ]
    early, slow = (processes[1], processes[0]) if late == "algo-1" else processes
    assert early.stderr is not None
    seen = []
    for line in early.stderr:
        seen.append(line)
        if "recording stacks, stopping this host's workers" in line:
            break
    else:
        pytest.fail("no teardown began: " + "".join(seen[-20:]))
    slow.send_signal(signal.SIGSTOP)
    time.sleep(3.0)  # the most the side channel takes for no loss (4 s: 5 s without a beat)
    slow.send_signal(signal.SIGCONT)
    results = [finish(p, timeout=180) for p in processes]
    for (returncode, _, err), tree in zip(results, trees, strict=True):
        assert returncode == 124, err[-3000:]
        line = first_line(tree)
        assert line.startswith(
            "hung: rank 3 on algo-2 never entered all_reduce #5 of the default group; "
            "the 3 other ranks wait in it since "
        ), (line, err[-3000:])
        assert "rank 3 was at fault_probe.py:" in line and " in evaluate" in line, line
        assert not any(alive(pid) for pid in worker_pids(tree))


def _start_without_watchdog(tree, hps, **env):
    """The probe with no hang watchdog: the collectives' own timeout ends the job."""
    (tree.base / "code" / "fault_probe.py").write_bytes(PROBE.read_bytes())
    return start(tree, {name: json.dumps(value) for name, value in hps.items()}, **env)


TIMED_OUT = "collective timed out: "


def test_a_collective_timeout_on_one_host_names_the_rank_it_waited_for(tmp_path):
    """gloo's own timeout (3 s) ends rank 0 in the 4th all_reduce (#5), which rank 1 never entered;
    torchrun then ends rank 1 at once, but its records and stack were asked for before rank
    0's wrapper exited (rank 0's own at its death): the first line blames rank 1."""
    tree = make_tree(tmp_path, script=None)
    hps = {"mode": "skip", "rank": "1", "pg-timeout": "3"}
    returncode, _, err = finish(_start_without_watchdog(tree, hps), timeout=120)
    assert returncode == 1, err[-3000:]
    line = first_line(tree)
    assert line.startswith(
        TIMED_OUT + "rank 1 on algo-1 never entered all_reduce #5 of the default group; "
        "the 1 other rank waits in it since "
    ), line
    assert "rank 1 was at fault_probe.py:" in line and " in evaluate" in line, line
    assert "; rank 0 (local 0) on algo-1: exit code 1: RuntimeError: " in line, line
    assert "Timed out waiting 3000ms" in line, line
    assert line.endswith("[first failure]"), line


@pytest.mark.parametrize(
    ("mode", "culprit"),
    [
        (
            "skip",
            TIMED_OUT + "rank 3 on algo-2 never entered all_reduce #5 of the default group; "
            "the 3 other ranks wait in it since ",
        ),
        (
            "desync",
            TIMED_OUT + "ranks disagree at collective #5: ranks 0-2 in all_reduce([4096] float32), "
            "rank 3 in broadcast([1] int64); ",
        ),
    ],
)
def test_a_collective_timeout_across_hosts_names_its_culprit_first_on_every_host(
    tmp_path, hosts_file, mode, culprit
):
    """The collectives time out (gloo, 4 s) on both hosts; every host's records, the dead
    ranks' and the live ones', reach the master, and both failure files start with the rank
    to blame, then the job's first failure in its usual words."""
    hps = {"mode": mode, "rank": "3", "pg-timeout": "4"}
    trees, results = _two_hosts(tmp_path, hosts_file, hps, _start_without_watchdog)
    for (returncode, _, err), tree in zip(results, trees, strict=True):
        assert returncode != 0, err[-3000:]
        line = first_line(tree)
        assert line.startswith(culprit), (line, err[-3000:])
        assert line.endswith("[first failure]"), line
    assert first_line(trees[0]) == first_line(trees[1])
