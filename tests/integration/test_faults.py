"""Failure, stop and logs, in real processes: one host with two real torchrun workers where a
test is about several ranks of one host (a culprit among them, a sibling, their lines), one
where it is about a host, a stop or the bootstrap alone, and two hosts on one machine for the
cross-host rows (the docker variants are in tests/docker)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from container_entry.hosts import SETTLE_SECONDS
from tests.conftest import EXIT_BOUND
from tests.integration.conftest import (
    REPO,
    Drained,
    bootstrap_argv,
    bootstrap_env,
    launcher_of,
    make_tree,
    ranks_started,
    wait_for,
    with_hosts_file,
)
from tests.ports import job_port

FAULT = REPO / "tests" / "scripts" / "fault_probe.py"


def start(tree, hyperparameters=None, argv_wrap=None, python=sys.executable, ranks=2, **env):
    """The bootstrap of `tree`'s host, with `ranks` local ranks (PET_NPROC_PER_NODE)."""
    if hyperparameters is not None:
        (tree.base / "input/config/hyperparameters.json").write_text(json.dumps(hyperparameters))
    argv = bootstrap_argv(python=python)
    if argv_wrap:
        argv = argv_wrap(argv)
    environment = bootstrap_env(
        tree, SAGEMAKER_PROGRAM="fault_probe.py", PET_NPROC_PER_NODE=str(ranks), **env
    )
    return subprocess.Popen(
        argv, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/"
    )


def finish(process, timeout=120):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def first_line(tree) -> str:
    return (tree.output / "failure").read_text().splitlines()[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not a survivor
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[1].split()[0] != "Z"


def worker_pids(tree) -> list[int]:
    """Every script process the job started ("started rank N pid P" in the rank logs)."""
    logs = (tree.output / "data" / "container-entry" / "logs").glob("rank-*.log")
    return [
        int(pid)
        for path in logs
        for pid in re.findall(r"started rank \d+ pid (\d+)", path.read_text())
    ]


@pytest.mark.parametrize(
    ("fault", "code", "expected"),
    [
        (
            "raise",
            1,
            "rank 1 (local 1) on algo-1: exit code 1: ValueError: planted failure at step 2",
        ),
        ("exit3", 3, "rank 1 (local 1) on algo-1: exit code 3"),
        (
            "segfault",
            139,
            "rank 1 (local 1) on algo-1: signal SIGSEGV: Fatal Python error: "
            "Segmentation fault (hint: crashed in native code",
        ),
        (
            "sigkill-self",
            137,
            "rank 1 (local 1) on algo-1: signal SIGKILL (hint: killed by "
            "SIGKILL: likely out of host memory",
        ),
    ],
)
def test_worker_fault_names_rank_cause_and_exit_code(tmp_path, fault, code, expected):
    tree = make_tree(tmp_path, script=FAULT)
    (tree.base / "model").mkdir()
    (tree.base / "model" / "keep.bin").write_bytes(b"user")
    hps = {"fault": json.dumps(fault), "fault-rank": "1", "steps": "20", "step-seconds": "0.2"}
    returncode, _, err = finish(start(tree, hps))
    assert returncode == code, err[-3000:]
    line = first_line(tree)
    assert line.startswith(expected), line
    assert "[first failure]" in line
    record = json.loads((tree.output / "data/container-entry/rank-1.json").read_text())
    assert record["returncode"] in (1, 3, -11, -9)
    assert Path(record["log"]).exists()
    assert not any(alive(pid) for pid in worker_pids(tree))
    assert (tree.base / "model" / "keep.bin").read_bytes() == b"user"
    assert len((tree.output / "failure").read_text()) < 4096


def test_failure_that_outlives_every_restart_fails_the_job_naming_the_rank(tmp_path):
    tree = make_tree(tmp_path, script=FAULT)
    hps = {
        "fault": '"raise"',
        "fault-rank": "1",
        "steps": "20",
        "step-seconds": "0.2",
        "container_entry_max_restarts": "1",
    }
    returncode, _, err = finish(start(tree, hps), timeout=180)
    assert returncode == 1, err[-3000:]
    line = first_line(tree)
    assert line.startswith(
        "rank 1 (local 1) on algo-1: exit code 1: ValueError: planted failure at step 2 "
        "(after 1 restart)"
    ), line
    log = (tree.output / "data/container-entry/logs/rank-1.log").read_text()
    assert log.count("started rank 1") == 2  # the first attempt and the one restart
    assert not any(alive(pid) for pid in worker_pids(tree))


SLOW_CHECKPOINT = 35.0  # seconds a rank needs after SIGTERM: past torchrun's old fixed 30 s


def test_sigterm_reaches_every_rank_fast_and_a_slow_checkpoint_is_written(tmp_path, newest_python):
    """The default grace (100 s) holds for a checkpoint that takes 35 s, on the newest torch
    (torchrun's own --shutdown-timeout); tests/docker has the same on torch 2.9."""
    tree = make_tree(tmp_path, script=FAULT)
    (tree.base / "checkpoints").mkdir()
    (tree.base / "checkpoints" / "older.bin").write_bytes(b"keep")
    hps = {
        "steps": "100000",
        "step-seconds": "0.2",
        "checkpoint-on-term": "true",
        "term-work-seconds": str(SLOW_CHECKPOINT),
    }
    process = start(tree, hps, python=newest_python)
    assert wait_for(lambda: ranks_started(tree))
    time.sleep(1.0)
    sent = time.time()
    process.send_signal(signal.SIGTERM)
    returncode, _, err = finish(process, timeout=SLOW_CHECKPOINT + 60)
    took = time.time() - sent
    assert returncode == 143, err[-3000:]
    assert SLOW_CHECKPOINT <= took < SLOW_CHECKPOINT + 2 * EXIT_BOUND, took  # never the grace
    latencies = [
        float((tree.output / "data" / f"term-rank-{r}.txt").read_text()) - sent for r in (0, 1)
    ]
    # a stop held back would reach a rank only with torchrun's own kill or after the other's
    # 35 s checkpoint; 10 s tells that apart on a loaded machine (the milliseconds it takes:
    # `make bench`, "docker stop -> every rank signalled")
    assert max(latencies) < 10.0, latencies
    for rank in (0, 1):
        assert (tree.base / "checkpoints" / f"checkpoint-rank-{rank}.json").exists()
    assert (tree.base / "checkpoints" / "older.bin").read_bytes() == b"keep"
    line = first_line(tree)
    assert line.startswith("job stopped by SIGTERM on algo-1"), line
    # from the checkpoint's end to the ranks' exit: EXIT_BOUND on a loaded machine, as below
    within = re.search(r"all 2 local ranks exited within (\d+\.\d) s$", line)
    assert within and SLOW_CHECKPOINT <= float(within[1]) < SLOW_CHECKPOINT + EXIT_BOUND, line
    assert not any(alive(pid) for pid in worker_pids(tree))
    print(f"SIGTERM -> ranks signalled: {max(latencies) * 1000:.0f} ms")


@pytest.mark.parametrize("release", ["newest", "2.9.0"])
def test_a_rank_polling_the_store_as_it_exits_ends_promptly_after_a_stop(
    tmp_path, request, release
):
    """What NCCL does and gloo hides (docs/gpu.md, an H200 on torch 2.11): a thread polls the
    job's store, which torchrun hosts, until the process exits, and the exit waits for it. A stop
    design that froze torchrun left such a rank alive until the grace ran out, then called it
    one that ignored the stop. Here: each rank checkpoints for 2 s and returns from its handler;
    it must be gone within EXIT_BOUND after that, and the bootstrap within EXIT_BOUND of its
    last rank (the grace: 40 s). On the newest torch (torchrun told --shutdown-timeout), and
    planned for torch 2.9 (torchrun without it) with the .venv's launcher. One local rank: the
    store it polls is torchrun's, the same for each rank, and a rank's exit waits on no other
    rank."""
    tree = make_tree(tmp_path, script=FAULT)
    python, extra = launcher_of(request, release, tmp_path / "fake-torch")
    work = 2.0
    hps = {
        "steps": "100000",
        "step-seconds": "0.2",
        "checkpoint-on-term": "true",
        "term-work-seconds": str(work),
        "poll-store": "true",
    }
    process = start(
        tree, hps, python=python, ranks=1, CONTAINER_ENTRY_STOP_GRACE_PERIOD="40", **extra
    )
    assert wait_for(lambda: ranks_started(tree, count=1))
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    returncode, _, err = finish(process, timeout=80)
    gone = time.time()
    assert returncode == 143, err[-3000:]
    record = tree.output / "data" / "container-entry" / "rank-0.json"
    ended = json.loads(record.read_text())["ended_at"]
    checkpoint = tree.base / "checkpoints" / "checkpoint-rank-0.json"
    # from the handler's return (its checkpoint written) to the rank's process gone
    exiting = ended - checkpoint.stat().st_mtime
    assert exiting < EXIT_BOUND, (exiting, err[-3000:])
    assert gone - ended < EXIT_BOUND, gone - ended
    line = first_line(tree)
    within = re.search(r"all 1 local ranks exited within (\d+\.\d) s$", line)
    assert within and work <= float(within[1]) < work + EXIT_BOUND, line
    assert not any(alive(pid) for pid in worker_pids(tree))
    print(
        f"handler returned -> rank gone {exiting:.2f} s; rank -> bootstrap gone "
        f"{gone - ended:.2f} s"
    )


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.1, 0.2, 0.4, 0.6, 1.0])
def test_a_stop_as_the_ranks_finish_is_a_success_or_a_stop_never_a_failure(tmp_path, delay):
    """SIGTERM `delay` s after the last rank's last line (SDK local mode stops a container as
    soon as another exits): ranks whose scripts had all ended before it, each exiting with its
    own status 0, make a success (exit 0, nothing relayed), even when a rank was still on its
    way out; a script the stop reached still running makes a stopped job (143). Never
    torchrun's own exit code for the signal the bootstrap gave it (1, 137)."""
    tree = make_tree(tmp_path, script=FAULT)
    process = start(
        tree, {"steps": "3", "step-seconds": "0.1"}, CONTAINER_ENTRY_MASTER_PORT=str(job_port())
    )
    logs = tree.output / "data" / "container-entry" / "logs"
    assert wait_for(lambda: sum("done rank" in p.read_text() for p in logs.glob("*.log")) == 2)
    time.sleep(delay)
    sending = time.time()
    process.send_signal(signal.SIGTERM)
    sent = time.time()  # the bootstrap notes its stop between the two
    returncode, _, err = finish(process, timeout=60)
    records = [json.loads(p.read_text()) for p in logs.parent.glob("rank-*.json")]
    assert len(records) == 2, err[-3000:]

    def ended_by(moment: float) -> bool:
        return all(r["script_ended_at"] <= moment and r["returncode"] == 0 for r in records)

    if ended_by(sending):  # every script had ended: a finished job, whatever the exits did
        assert returncode == 0, (records, err[-3000:])
    if returncode == 0:
        assert ended_by(sent), records
        assert (tree.output / "success").exists() and not (tree.output / "failure").exists()
    else:
        assert returncode == 143 and not ended_by(sending), (returncode, err[-3000:])
        assert first_line(tree).startswith("job stopped by SIGTERM on algo-1"), first_line(tree)
    # the bootstrap's own lines (a rank's SIGTERM handler calling sys.exit inside the script's
    # atexit callbacks prints the script's traceback, tagged with its rank: the user's own)
    ours = [line for line in err.splitlines() if not line.startswith("[algo-1 rank ")]
    assert not any("Traceback" in line for line in ours), err[-3000:]


@pytest.mark.parametrize("count", [1, 2])
def test_a_stop_while_the_ranks_exit_after_their_scripts_ended_is_a_success(
    tmp_path, request, count
):
    """Every script has ended and the ranks are in their exit (the scripts' own exit handlers
    take a while, as flushing a tracker does: here until the stop has come) when every host is
    stopped (StopTrainingJob, or SDK local mode stopping the other containers once one
    exited): the stop changes nothing of theirs (each exits 0, its own status), so every host
    exits 0 with a success file. Before: 143 (`all 2 local ranks exited within ...`), or the
    script's SIGTERM handler's own 143 after its end. One local rank per host: every rank is
    held in its exit alike, so a second one on a host only repeats the first."""
    hosts = ("algo-1", "algo-2")[:count]
    wrap = None
    if count > 1:
        hosts_file = request.getfixturevalue("hosts_file")

        def wrap(argv):
            return with_hosts_file(argv, hosts_file)

    trees = [make_tree(tmp_path, script=FAULT, current_host=h, hosts=hosts) for h in hosts]
    # each rank's exit handler is held until the test lets it end (a fixed 3 s let a rank that
    # printed first end before the stop came when another was stalled for seconds)
    release = tmp_path / "exits-may-end"
    hps = {"steps": "2", "step-seconds": "0.1", "exit-until-file": json.dumps(str(release))}
    port = str(job_port())
    processes = [
        start(t, hps, argv_wrap=wrap, ranks=1, CONTAINER_ENTRY_MASTER_PORT=port) for t in trees
    ]
    drained = [Drained(process) for process in processes]
    logs = [t.output / "data" / "container-entry" / "logs" for t in trees]

    def exiting() -> int:
        return sum("exiting rank" in p.read_text() for d in logs for p in d.glob("rank-*.log"))

    try:
        assert wait_for(lambda: exiting() == count, timeout=120)  # one rank per host
        sent = time.time()
        for process in processes:
            process.send_signal(signal.SIGTERM)
        # the exits end once every bootstrap is signalling its ranks (it says so just before),
        # and a moment for the signals: the stop reaches ranks that are still in their exit
        wait_for(lambda: all(d.said("stopping every rank") for d in drained), timeout=30)
        time.sleep(1.0)
    finally:
        release.touch()
    for tree, folder, process in zip(trees, logs, drained, strict=True):
        returncode, err = process.finish(timeout=60)
        assert returncode == 0, err[-3000:]
        assert (tree.output / "success").exists() and not (tree.output / "failure").exists()
        records = [json.loads(p.read_text()) for p in folder.parent.glob("rank-*.json")]
        assert [r["returncode"] for r in records] == [0], records
        assert all(r["script_ended_at"] < sent < r["ended_at"] for r in records), records


def test_a_host_stopped_after_its_ranks_finished_is_a_success_on_both(tmp_path, hosts_file):
    """algo-2's ranks are done and its torchrun waits at the exit barrier for algo-1, which
    works 8 s longer: a stop of algo-2 then ends it at once with exit 0 (before: 1, or 137
    after grace + 5 s), relays nothing, and algo-1 finishes its job normally. One local rank
    per host: the hosts are what this is about."""
    hosts = ("algo-1", "algo-2")
    trees = [make_tree(tmp_path, script=FAULT, current_host=h, hosts=hosts) for h in hosts]
    hps = {"steps": "3", "step-seconds": "0.1", "linger-host": "algo-1", "linger-seconds": "8"}
    port = str(job_port())
    processes = [
        start(
            t,
            hps,
            argv_wrap=lambda a: with_hosts_file(a, hosts_file),
            ranks=1,
            CONTAINER_ENTRY_MASTER_PORT=port,
        )
        for t in trees
    ]
    second = trees[1].output / "data" / "container-entry"
    assert wait_for(lambda: len(list(second.glob("rank-*.json"))) == 1, timeout=120)
    time.sleep(0.5)
    sent = time.monotonic()
    processes[1].send_signal(signal.SIGTERM)
    returncode, _, err = finish(processes[1], timeout=60)
    assert returncode == 0, err[-3000:]
    assert time.monotonic() - sent < 20.0  # not torchrun's 300 s exit barrier, nor the grace
    assert (trees[1].output / "success").exists()
    returncode, _, err = finish(processes[0], timeout=60)
    assert returncode == 0, err[-3000:]
    assert (trees[0].output / "success").exists()


def test_nothing_outlives_a_bootstrap_killed_outside_a_container(tmp_path):
    """Without a container's PID 1 to take everything down, SIGKILL of the bootstrap alone:
    torchrun dies with it, and so does every rank (each in a session of its own)."""
    tree = make_tree(tmp_path, script=FAULT)
    process = start(tree, {"steps": "100000", "step-seconds": "0.2"})
    assert wait_for(lambda: ranks_started(tree))
    pids = worker_pids(tree)
    assert len(pids) == 2
    process.kill()
    process.communicate(timeout=30)
    assert wait_for(lambda: not any(alive(pid) for pid in pids), timeout=10), pids


def test_rank_sleeping_through_sigterm_is_killed_after_the_grace_period(tmp_path):
    tree = make_tree(tmp_path, script=FAULT)
    process = start(
        tree,
        {"steps": "1000", "step-seconds": "0.2", "ignore-term": "true"},
        CONTAINER_ENTRY_STOP_GRACE_PERIOD="3",
    )
    assert wait_for(lambda: ranks_started(tree))
    time.sleep(1.0)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    returncode, _, err = finish(process, timeout=60)
    took = time.monotonic() - sent
    assert returncode == 143, err[-3000:]
    # the grace, then the kill and the exits (EXIT_BOUND on a loaded machine); far below the
    # default grace (100 s) or a rank never killed
    assert 3.0 <= took < 3.0 + EXIT_BOUND, took
    assert not any(alive(pid) for pid in worker_pids(tree))
    line = first_line(tree)
    assert line.endswith("ranks 0, 1 still running after the 3 s grace period were killed"), line


def test_every_line_is_live_tagged_and_logged_per_rank(tmp_path):
    tree = make_tree(tmp_path, script=FAULT)
    process = start(tree, {"steps": "6", "step-seconds": "1.0"})
    latencies = []
    assert process.stdout is not None
    for line in process.stdout:
        arrived = time.time()
        if "] step " in line and " t=" in line:
            assert line.startswith(("[algo-1 rank 0] step", "[algo-1 rank 1] step")), line
            latencies.append(arrived - float(line.rsplit("t=", 1)[1]))
    returncode, _, err = finish(process)
    assert returncode == 0, err[-2000:]
    assert len(latencies) == 12
    # a line held back would come out with the next step's (1 s) or at the end (6 s); that a
    # line goes out during a quiet spell is judged by its event in test_relay.py, not by a
    # margin a loaded machine can exceed
    assert max(latencies) < 5.0, latencies
    log = (tree.output / "data/container-entry/logs/rank-1.log").read_text()
    assert "step 5 rank 1" in log
    print(f"print -> stdout: max {max(latencies) * 1000:.0f} ms")


def test_console_can_show_rank_zero_only(tmp_path):
    tree = make_tree(tmp_path, script=FAULT)
    returncode, out, err = finish(
        start(tree, {"steps": "2", "step-seconds": "0"}, CONTAINER_ENTRY_CONSOLE_RANKS="0")
    )
    assert returncode == 0, err[-2000:]
    assert "[algo-1 rank 0] step 1" in out and "rank 1]" not in out + err
    log = (tree.output / "data/container-entry/logs/rank-1.log").read_text()
    assert "step 1 rank 1" in log


def test_secrets_never_appear_in_bootstrap_lines(tmp_path):
    tree = make_tree(tmp_path, script=FAULT)
    hps = {"steps": "1", "hf_token": '"hf_TOPSECRET123"'}
    returncode, _, err = finish(start(tree, hps, ranks=1, WANDB_API_KEY="wandb-SECRET-456"))
    assert returncode == 0, err[-2000:]
    ours = [line for line in err.splitlines() if line.startswith("[container-entry]")]
    assert ours and not any("TOPSECRET" in line or "SECRET-456" in line for line in ours)
    assert any("--hf_token ****" in line for line in ours)


def test_master_port_in_use_is_reported_before_any_worker_starts(tmp_path):
    tree = make_tree(tmp_path, script=FAULT)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        returncode, _, err = finish(start(tree, {}, CONTAINER_ENTRY_MASTER_PORT=str(port)))
    assert returncode == 3, err[-2000:]
    assert f"master port {port} is in use" in first_line(tree)
    assert not (tree.output / "data" / "container-entry" / "logs").exists()


def test_peer_that_never_joins_is_reported_before_any_worker_starts(tmp_path, hosts_file):
    tree = make_tree(tmp_path, script=FAULT, hosts=("algo-1", "algo-2"))
    started = time.monotonic()
    returncode, _, err = finish(
        start(
            tree,
            {},
            argv_wrap=lambda a: with_hosts_file(a, hosts_file),
            CONTAINER_ENTRY_JOIN_TIMEOUT="3",
            CONTAINER_ENTRY_MASTER_PORT=str(job_port()),
        )
    )
    assert returncode == 3, err[-2000:]
    assert time.monotonic() - started < 30
    assert "algo-2 never joined the job within 3 s" in first_line(tree)


def test_two_failures_at_once_on_two_hosts_are_one_story(tmp_path, hosts_file):
    """Rank 1 on algo-1 and rank 3 on algo-2 fail at the same step, milliseconds apart: the
    master decides which was first and both hosts write that same first line and exit code."""
    hosts = ("algo-1", "algo-2")
    trees = [make_tree(tmp_path, script=FAULT, current_host=h, hosts=hosts) for h in hosts]
    hps = {"fault": '"raise"', "fault-rank": '"1,3"', "fault-step": "3", "steps": "1000"}
    port = str(job_port())
    processes = [
        start(
            t,
            {**hps, "step-seconds": "0.2"},
            argv_wrap=lambda a: with_hosts_file(a, hosts_file),
            CONTAINER_ENTRY_MASTER_PORT=port,
        )
        for t in trees
    ]
    results = [finish(p, timeout=120) for p in processes]
    lines = [first_line(tree) for tree in trees]
    assert [code for code, _, _ in results] == [1, 1], [err[-2000:] for _, _, err in results]
    assert lines[0] == lines[1], lines
    assert re.fullmatch(
        r"rank [13] \(local 1\) on algo-[12]: exit code 1: ValueError: planted failure at step 3 "
        r"\[first failure\]",
        lines[0],
    ), lines[0]
    ended = {
        rank: json.loads((tree.output / f"data/container-entry/rank-{rank}.json").read_text())
        for rank, tree in ((1, trees[0]), (3, trees[1]))
    }
    # the one that began first (RankRecord.began: its traceback's start, else its end)
    began = {rank: record.get("failed_at") or record["ended_at"] for rank, record in ended.items()}
    first = 1 if began[1] <= began[3] else 3
    print(f"rank 1 - rank 3 began {began[1] - began[3]:+.3f} s; {lines[0]}")
    if abs(began[1] - began[3]) > 0.02:  # beyond the clocks' error
        assert lines[0].startswith(f"rank {first} "), (ended, lines[0])


def test_failure_on_one_host_ends_every_host_fast(tmp_path, hosts_file):
    hosts = ("algo-1", "algo-2")
    trees = [make_tree(tmp_path, script=FAULT, current_host=h, hosts=hosts) for h in hosts]
    hps = {
        "fault": '"raise"',
        "fault-rank": "3",
        "fault-step": "3",
        "steps": "1000",
        "step-seconds": "0.2",
    }
    port = str(job_port())
    processes = [
        start(
            t,
            hps,
            argv_wrap=lambda a: with_hosts_file(a, hosts_file),
            CONTAINER_ENTRY_MASTER_PORT=port,
        )
        for t in trees
    ]
    results = [finish(p, timeout=120) for p in processes]
    ended = time.time()
    failed_at = json.loads((trees[1].output / "data/container-entry/rank-3.json").read_text())[
        "ended_at"
    ]
    for (returncode, _, err), tree in zip(results, trees, strict=True):
        assert returncode == 1, err[-3000:]
        line = first_line(tree)
        assert "rank 3 (local 1) on algo-2: exit code 1: ValueError: planted failure" in line
    # at most the master's settling wait for the first failure, then the bootstraps' exits
    # (EXIT_BOUND on a loaded machine: a bound equal to the wait alone failed there); far
    # below gloo's 30 min timeout or a stop's grace (100 s)
    assert ended - failed_at < SETTLE_SECONDS + EXIT_BOUND, ended - failed_at
    healthy = (trees[0].output / "failure").read_text()
    for rank in (0, 1):  # stacks taken before the teardown, of each rank still running then
        own = rf"rank {rank} \(local {rank}\) on algo-1: exit code 1: RuntimeError: .* by peer"
        # gloo may end it first on its own: rank 3's exit closed its connections (torch
        # 2.13's gloo raised in the next all_reduce before the word came, run 84); NCCL blocks
        assert f"rank {rank} was at fault_probe.py:" in healthy or re.search(own, healthy), healthy
    print(f"failure -> all hosts exited: {ended - failed_at:.1f} s")
    for tree in trees:
        assert not any(alive(pid) for pid in worker_pids(tree))


@pytest.mark.parametrize(
    ("restart_count", "marker", "preflight_exit", "runs_preflight", "runs_script", "exit_code"),
    [
        (0, None, 0, True, True, 0),  # first attempt: preflight, then the script
        (0, None, 4, True, False, 4),  # preflight fails: the script never starts
        (1, "preflight-passed", 0, False, True, 0),  # the restart on the failed rank's host
        # a host that only rejoined the new round: torchrun's count stays 0 there
        (0, "preflight-passed", 0, False, True, 0),
        (1, "preflight-failed", 0, False, False, 1),  # after a failed one: nothing at all
        (0, "preflight-failed", 0, False, False, 1),
    ],
)
def test_the_worker_wrapper_runs_the_script_only_after_a_passed_preflight(
    tmp_path, restart_count, marker, preflight_exit, runs_preflight, runs_script, exit_code
):
    """The real wrapper (`python -m container_entry.worker`) in one rank's slot, as torchrun
    starts it, for every combination of attempt and earlier preflight outcome on this host."""
    control, run_dir = tmp_path / "control", tmp_path / "run"
    control.mkdir()
    ran = tmp_path / "ran"
    ran.mkdir()
    check = tmp_path / "check.py"
    check.write_text(
        f"import pathlib, sys\npathlib.Path({str(ran / 'preflight')!r}).touch()\n"
        f"sys.exit({preflight_exit})\n"
    )
    script = tmp_path / "train.py"
    script.write_text(f"import pathlib\npathlib.Path({str(ran / 'script')!r}).touch()\n")
    (control / "command.json").write_text(
        json.dumps({"argv": [str(script)], "preflight": [str(check)], "run_dir": str(run_dir)})
    )
    if marker:
        (control / marker).touch()
    env = {
        **os.environ,
        "_CONTAINER_ENTRY_CONTROL": str(control),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
    }
    done = subprocess.run(
        [sys.executable, "-m", "container_entry.worker"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == exit_code, done.stderr
    assert (ran / "preflight").exists() == runs_preflight
    assert (ran / "script").exists() == runs_script
    record = run_dir / "rank-0.json"
    # a refused restart leaves the first attempt's record
    assert record.exists() != (marker == "preflight-failed")
    if record.exists():
        stage = json.loads(record.read_text())["stage"]
        assert stage == ("preflight" if preflight_exit else None)
    failed = marker == "preflight-failed" or preflight_exit != 0
    assert (control / "preflight-failed").exists() == failed
    assert (control / "preflight-passed").exists() == (not failed)


def test_a_failed_preflight_never_starts_the_script_on_a_restart(tmp_path):
    """GPU mock (a fake `nvidia-smi` counting 2 GPUs torch cannot see). One host, preflight
    forced on and many restarts: torchrun restarts a one-host group fastest, so this is where a
    restarted attempt would most likely get to run the script before the bootstrap ends the job.
    The preflight failure is permanent: one verdict, the script never started."""
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: GPU-0)'\necho 'GPU 1: Fake GPU (UUID: GPU-1)'\n"
    )
    (fake / "nvidia-smi").chmod(0o755)
    tree = make_tree(tmp_path, script=FAULT)
    process = start(
        tree,
        {"steps": "3", "container_entry_max_restarts": "50", "container_entry_preflight": "true"},
        PATH=f"{fake}:{os.environ['PATH']}",
    )
    returncode, out, err = finish(process, timeout=180)
    assert returncode == 4, err[-2000:]  # a device problem
    line = first_line(tree)
    assert line.startswith("preflight failed, the script did not start"), line
    assert "(not restarted: the preflight found a problem of the host" in line, line
    logs = sorted((tree.output / "data" / "container-entry").glob("logs/rank-*.log"))
    assert len(logs) == 2, logs
    for log in logs:
        assert "started rank" not in log.read_text(), log
    assert "started rank" not in out


@pytest.mark.parametrize("restarts", [0, 2])
def test_preflight_names_the_host_whose_device_count_is_wrong(tmp_path, hosts_file, restarts):
    """GPU mock (no GPU exists here): a fake `nvidia-smi` on algo-2 stands in for the tool on
    a 2-GPU host (it exits 0, so no driver files are needed), so the plan counts 2 while torch
    sees none; the job must stop before the script starts, naming algo-2 and the versions, in
    the preflight's gpu-count check. With restarts allowed, torchrun may start the group again
    before the bootstrap ends the job: that attempt must not start the script either. One
    local rank per host: torch's GPU count, and so the check, is the same for every rank of a
    host."""
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: GPU-0)'\necho 'GPU 1: Fake GPU (UUID: GPU-1)'\n"
    )
    (fake / "nvidia-smi").chmod(0o755)
    hosts = ("algo-1", "algo-2")
    trees = [make_tree(tmp_path, script=FAULT, current_host=h, hosts=hosts) for h in hosts]
    processes = []
    port = str(job_port())
    for tree in trees:
        extra = (
            {"PATH": f"{fake}:{os.environ['PATH']}"} if tree.base.parent.name == "algo-2" else {}
        )
        processes.append(
            start(
                tree,
                {"steps": "3", "container_entry_max_restarts": str(restarts)},
                ranks=1,
                CONTAINER_ENTRY_MASTER_PORT=port,
                argv_wrap=lambda a: with_hosts_file(a, hosts_file),
                **extra,
            )
        )
    results = [finish(p, timeout=180) for p in processes]
    for (returncode, out, err), tree in zip(results, trees, strict=True):
        assert returncode == 4, err[-2000:]  # this (or the other) host's GPUs, as counted
        line = first_line(tree)
        # the preflight checks it on every host (the launcher's own check is for jobs without
        # one), with the versions the launcher's check would name
        assert line.startswith("preflight failed, the script did not start"), line
        assert "preflight check 'gpu-count' failed on host algo-2: torch " in line, line
        assert "sees 0 GPUs, but 2 GPUs were counted; NVIDIA driver not found" in line, line
        assert "started rank" not in out  # the user's script never ran
        logs = sorted((tree.output / "data" / "container-entry").glob("logs/rank-*.log"))
        assert logs  # the preflight's own output is there
        for log in logs:
            assert "started rank" not in log.read_text(), log
