"""A host that dies, freezes or drops off the network is noticed, in real processes.

Two real bootstraps on one machine, each with one real torchrun worker (two where a test is about
several ranks of one host: a stop's delivery to every local rank), resolving algo-1 and algo-2
through a private /etc/hosts (a mount namespace each; needs root). One host's bootstrap
is killed (SIGKILL), frozen (SIGSTOP) or cut off the network (each host in its own network
namespace joined by a veth pair; the link goes down): the other must stop, naming it, within the
bound docs/liveness.md states. Also: a torchrun failure with no rank record reaches the other
host, peers of a master that gives up name the host that never joined, and a stop at any phase
of one host's start ends both hosts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from container_entry.hosts import LIVENESS_TIMEOUT
from tests.conftest import EXIT_BOUND
from tests.integration.conftest import (
    REPO,
    Drained,
    MlTree,
    bootstrap_argv,
    bootstrap_env,
    make_tree,
    ranks_started,
    wait_for,
    with_hosts_file,
)
from tests.ports import job_port

FAULT = REPO / "tests" / "scripts" / "fault_probe.py"
HOSTS = ("algo-1", "algo-2")
GRACE = 3.0  # CONTAINER_ENTRY_FAILURE_GRACE_PERIOD in these tests
# docs/liveness.md: a frozen or cut-off host is noticed within 6 s (the liveness timeout, a
# look and the relay); the rest is the survivors' own teardown (the failure grace) and exit
NOTICED_WITHIN = 6.0
EXITED_WITHIN = NOTICED_WITHIN + GRACE + 6.0
TRAINING = {"steps": "100000", "step-seconds": "0.2"}


@pytest.fixture
def root_and_unshare():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("two-host tests need root and unshare (CI runs as root)")


@dataclass
class Host:
    name: str
    tree: MlTree
    process: subprocess.Popen
    local_ranks: int  # PET_NPROC_PER_NODE
    output: Drained  # its stderr, each line with when it came

    def first_line(self) -> str:
        return (self.tree.output / "failure").read_text().splitlines()[0]

    def when(self, text: str) -> float | None:
        return self.output.when(text)

    def stderr(self) -> str:
        return self.output.text()[-4000:]

    def ranks_started(self, count: int | None = None) -> bool:
        """True once `count` ranks (all this host's local ranks unless told) printed their
        first line."""
        return ranks_started(self.tree, self.local_ranks if count is None else count)

    def descendants(self) -> list[int]:
        """Every process below this bootstrap (torchrun, its workers), read from /proc."""
        found, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            for task in Path(f"/proc/{pid}/task").glob("*"):
                with contextlib.suppress(OSError):
                    children = [int(c) for c in (task / "children").read_text().split()]
                    found += children
                    todo += children
        return found


def start_host(
    tmp_path: Path,
    name: str,
    hosts_file: Path,
    *,
    hosts: tuple[str, ...] = HOSTS,
    hps: dict[str, str] | None = None,
    netns: str | None = None,
    interface: str = "lo",
    **env: str,
) -> Host:
    tree = make_tree(tmp_path, script=FAULT, current_host=name, hosts=hosts, interface=interface)
    (tree.base / "input/config/hyperparameters.json").write_text(json.dumps(hps or TRAINING))
    argv = with_hosts_file(bootstrap_argv(), hosts_file)
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    settings = {
        "SAGEMAKER_PROGRAM": "fault_probe.py",
        # one rank per host: these tests are about hosts (a test about several ranks of one
        # host asks for more)
        "PET_NPROC_PER_NODE": "1",
        "CONTAINER_ENTRY_PREFLIGHT": "false",
        "CONTAINER_ENTRY_FAILURE_GRACE_PERIOD": str(GRACE),
        **env,
    }
    process = subprocess.Popen(
        argv,
        env=bootstrap_env(tree, **settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    return Host(name, tree, process, int(settings["PET_NPROC_PER_NODE"]), Drained(process))


def hosts_file_for(tmp_path: Path, addresses: dict[str, str]) -> Path:
    path = tmp_path / "hosts"
    lines = ["127.0.0.1 localhost", *(f"{ip} {name}" for name, ip in addresses.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def exited_at(host: Host, timeout: float) -> float:
    """When the host's bootstrap exited (fails the test if it did not within `timeout`)."""
    try:
        host.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{host.name} still running {timeout:g} s later:\n{host.stderr()}")
    return time.time()


def kill_everything(hosts: list[Host], leftovers: list[int]) -> None:
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    for host in hosts:
        for pid in [host.process.pid, *host.descendants()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            host.process.wait(timeout=10)


def start_training(tmp_path: Path, hosts_file: Path, port: int, **kwargs) -> list[Host]:
    hosts = [
        start_host(tmp_path, name, hosts_file, CONTAINER_ENTRY_MASTER_PORT=str(port), **kwargs)
        for name in HOSTS
    ]
    if not wait_for(lambda: all(h.ranks_started() for h in hosts), 120):
        kill_everything(hosts, [])
        pytest.fail("the job did not start:\n" + "\n".join(h.stderr() for h in hosts))
    time.sleep(1.0)  # a few steps together
    return hosts


@pytest.mark.parametrize(
    ("victim", "fault", "expected"),
    [
        ("algo-2", "kill", "host algo-2 left the job without a word"),
        (
            "algo-2",
            "freeze",
            f"host algo-2 stopped answering (no heartbeat for {LIVENESS_TIMEOUT:g} s): its "
            "bootstrap died, froze or lost the network",
        ),
        ("algo-1", "freeze", "lost contact with the master host algo-1"),
    ],
)
def test_a_host_whose_bootstrap_dies_or_freezes_is_named_within_the_bound(
    tmp_path, root_and_unshare, victim, fault, expected
):
    """Noticed within the bound with every CPU of the machine busy meanwhile (DataLoader
    workers saturating a host: the survivor's side channel must still look in time)."""
    hosts_file = hosts_file_for(tmp_path, {"algo-1": "127.0.0.1", "algo-2": "127.0.0.1"})
    port = job_port()
    hosts = start_training(tmp_path, hosts_file, port)
    dead = next(h for h in hosts if h.name == victim)
    survivor = next(h for h in hosts if h.name != victim)
    leftovers = dead.descendants()  # a killed bootstrap's torchrun and workers live on
    try:
        with cpu_hog():
            os.kill(dead.process.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            faulted = time.time()  # after the call: a stall before it is not the product's
            ended = exited_at(survivor, EXITED_WITHIN + 10)
        noticed = survivor.when("another host failed") or survivor.when("stopping this host")
        took = (noticed or ended) - faulted
        print(
            f"{fault} {victim}: noticed by {survivor.name} after {took:.1f} s, "
            f"exited after {ended - faulted:.1f} s"
        )
        assert survivor.process.returncode != 0, survivor.stderr()
        assert survivor.first_line().startswith(expected), survivor.first_line()
        assert noticed is not None, survivor.stderr()
        # a closed connection is noticed at once (0.0-0.1 s idle); 4 s leaves room for this
        # test's own CPU hog and is still under the liveness timeout (5 s), so only the closed
        # connection, not the silence, can have told it (its words are asserted above)
        bound = 4.0 if fault == "kill" else NOTICED_WITHIN
        assert noticed - faulted <= bound, (noticed - faulted, survivor.stderr())
        assert ended - faulted <= EXITED_WITHIN, ended - faulted
        if fault == "freeze":  # thawed, the frozen host finds itself alone and stops too
            os.kill(dead.process.pid, signal.SIGCONT)
            exited_at(dead, 60)
            assert dead.process.returncode != 0, dead.stderr()
    finally:
        kill_everything(hosts, leftovers)


@contextlib.contextmanager
def cpu_hog() -> Iterator[None]:
    """Two busy processes per CPU for as long as it lasts: a host whose DataLoader workers
    saturate every core, where the side channel's threads must still get their turn."""
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    try:
        yield
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()


FROZEN_FOR = 3.0
# a round tests what it means to when the bootstrap (whose heartbeats are the ones that count)
# was stopped no longer than this: with up to a beat's interval (1 s) since its last heartbeat,
# its silence stays under the liveness timeout (5 s). A longer one (this test stalled on a busy
# machine between the SIGSTOP and the SIGCONT) is done again, FREEZE_TRIES such rounds at most
FROZEN_AT_MOST = 3.5
FREEZE_TRIES = 3


def freeze_for(host: Host, seconds: float) -> float:
    """Every process of the host stopped for `seconds`, as `docker pause` stops a container's
    (the bootstrap, torchrun and the ranks), then resumed, the bootstrap first: for how long its
    bootstrap was stopped at most (from before its SIGSTOP to after its SIGCONT)."""
    pids = [host.process.pid, *host.descendants()]
    stopped = time.monotonic()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    time.sleep(max(0.0, stopped + seconds - time.monotonic()))
    resumed = 0.0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        resumed = resumed or time.monotonic()
    return resumed - stopped


def freeze_each_in_turn(hosts: list[Host], rounds: list[float]) -> bool:
    """Each host frozen for FROZEN_FOR s in turn, every host still there after it; False when a
    round that ran too long (it does not count) lost the job. `rounds`: every round's span,
    FREEZE_TRIES too long ones in all at most."""
    for frozen in hosts:
        while True:
            rounds.append(freeze_for(frozen, FROZEN_FOR))
            time.sleep(2.0)  # the watchers' first looks after it, still with every CPU busy
            alive = [h.name for h in hosts if h.process.poll() is None]
            if rounds[-1] <= FROZEN_AT_MOST:
                assert alive == list(HOSTS), (frozen.name, rounds, [h.stderr() for h in hosts])
                break
            print(f"{frozen.name} frozen {rounds[-1]:.2f} s, beyond {FROZEN_AT_MOST} s: again")
            if sum(span > FROZEN_AT_MOST for span in rounds) >= FREEZE_TRIES:
                pytest.fail(f"no freeze within {FROZEN_AT_MOST} s on this machine: {rounds}")
            if alive != list(HOSTS):
                return False
    return True


def test_a_host_frozen_for_3_s_and_resumed_is_not_lost(tmp_path, root_and_unshare):
    """A whole host frozen for 3 s mid-training (every process of it, as `docker pause`), every
    CPU busy meanwhile, then resumed: no host is declared lost, either way round (the master,
    then the worker host, in one job), and both finish with exit 0 (each watcher counts
    silence on its own clock: the frozen one does not take its own 3 s for its peer's)."""
    rounds: list[float] = []
    for job in range(FREEZE_TRIES):  # a new job only where a round that ran too long lost one
        folder = tmp_path / f"job-{job}"
        folder.mkdir()
        hosts_file = hosts_file_for(folder, {"algo-1": "127.0.0.1", "algo-2": "127.0.0.1"})
        until = folder / "enough"
        hps = {"steps": "100000", "step-seconds": "0.2", "until-file": json.dumps(str(until))}
        hosts = start_training(folder, hosts_file, job_port(), hps=hps)
        try:
            with cpu_hog():
                if not freeze_each_in_turn(hosts, rounds):
                    continue
            print(f"bootstraps frozen for {', '.join(f'{span:.2f}' for span in rounds)} s")
            until.touch()  # enough: every rank ends after the same step
            for host in hosts:
                exited_at(host, 120)
                assert host.process.returncode == 0, host.stderr()
                assert (host.tree.output / "success").exists()
                stderr = host.stderr()
                assert "stopped answering" not in stderr and "lost contact" not in stderr
            return
        finally:
            kill_everything(hosts, [])
    pytest.fail(f"no freeze within {FROZEN_AT_MOST} s on this machine: {rounds}")


@pytest.fixture
def two_network_namespaces(root_and_unshare):
    """algo-1 and algo-2 each in a network namespace of its own, joined by a veth pair named
    `ce0` on both ends (10.251.0.1 and .2): `cut()` takes the link down, a pulled cable."""
    if shutil.which("ip") is None:
        pytest.fail("the network-drop test needs iproute2 (`ip`)")
    tag = f"{os.getpid() % 100000}"
    names = (f"ce-{tag}-1", f"ce-{tag}-2")

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)

    try:
        for ns in names:
            ip("netns", "add", ns)
        ip("link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b")
        for index, (ns, end) in enumerate(zip(names, (f"v{tag}a", f"v{tag}b"), strict=True)):
            ip("link", "set", end, "netns", ns)
            ip("-n", ns, "link", "set", end, "name", "ce0")
            ip("-n", ns, "addr", "add", f"10.251.0.{index + 1}/30", "dev", "ce0")
            ip("-n", ns, "link", "set", "ce0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as error:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        pytest.fail(f"cannot make network namespaces here: {error}")

    def cut() -> None:
        ip("-n", names[1], "link", "set", "ce0", "down")

    yield names, cut
    for ns in names:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def test_a_host_cut_off_the_network_is_named_within_the_bound(tmp_path, two_network_namespaces):
    (ns_one, ns_two), cut = two_network_namespaces
    hosts_file = hosts_file_for(tmp_path, {"algo-1": "10.251.0.1", "algo-2": "10.251.0.2"})
    port = str(job_port())
    hosts = [
        start_host(
            tmp_path,
            name,
            hosts_file,
            netns=ns,
            interface="ce0",
            CONTAINER_ENTRY_MASTER_PORT=port,
        )
        for name, ns in zip(HOSTS, (ns_one, ns_two), strict=True)
    ]
    try:
        if not wait_for(lambda: all(h.ranks_started() for h in hosts), 120):
            pytest.fail("the job did not start:\n" + "\n".join(h.stderr() for h in hosts))
        time.sleep(1.0)
        cut()
        cut_at = time.time()  # after `ip` returned: its start under load is not the product's
        master, member = hosts
        for host in hosts:
            ended = exited_at(host, EXITED_WITHIN + 10)
            noticed = host.when("another host failed") or host.when("stopping this host")
            print(
                f"network cut: {host.name} noticed after {(noticed or ended) - cut_at:.1f} s, "
                f"exited after {ended - cut_at:.1f} s"
            )
            assert host.process.returncode != 0, host.stderr()
            assert noticed is not None and noticed - cut_at <= NOTICED_WITHIN, host.stderr()
            assert ended - cut_at <= EXITED_WITHIN
        assert master.first_line().startswith("host algo-2 stopped answering ("), (
            master.first_line()
        )
        assert "lost contact with the master host algo-1" in member.first_line()
    finally:
        kill_everything(hosts, [])


def test_a_torchrun_failure_with_no_rank_record_reaches_the_other_host(tmp_path, root_and_unshare):
    """torchrun on algo-2 fails before any rank starts (here: a rendezvous backend that does
    not exist, as a rendezvous error would): algo-1, whose workers wait for algo-2's, stops
    and names it rather than hanging until the rendezvous times out."""
    hosts_file = hosts_file_for(tmp_path, {"algo-1": "127.0.0.1", "algo-2": "127.0.0.1"})
    port = str(job_port())
    master = start_host(tmp_path, "algo-1", hosts_file, CONTAINER_ENTRY_MASTER_PORT=port)
    broken = start_host(
        tmp_path,
        "algo-2",
        hosts_file,
        CONTAINER_ENTRY_MASTER_PORT=port,
        PET_RDZV_BACKEND="no-such-backend",
    )
    try:
        failed_at = exited_at(broken, 120)
        assert broken.process.returncode == 1, broken.stderr()
        assert broken.first_line().startswith(
            "torchrun on algo-2 failed with exit code 1 before any rank reported"
        )
        ended = exited_at(master, 60)
        assert master.process.returncode == 1, master.stderr()
        line = master.first_line()
        assert line.startswith(
            "torchrun on algo-2 failed with exit code 1 before any rank reported"
        ), line
        assert line.endswith("[first failure]"), line
        assert ended - failed_at < GRACE + 10, ended - failed_at
    finally:
        kill_everything([master, broken], [])


def test_peers_of_a_master_that_gives_up_name_the_host_that_never_joined(
    tmp_path, root_and_unshare
):
    hosts = ("algo-1", "algo-2", "algo-3")
    hosts_file = hosts_file_for(tmp_path, dict.fromkeys(hosts, "127.0.0.1"))
    # 8 s: algo-2 must have joined the master within the master's timeout (3 s was not always
    # enough for the master's start-up and algo-2's next try beside a busy suite)
    join_timeout = 8
    settings = {
        "CONTAINER_ENTRY_MASTER_PORT": str(job_port()),
        "CONTAINER_ENTRY_JOIN_TIMEOUT": str(join_timeout),
    }
    # the member starts first: its own join timeout passes before the master's
    member = start_host(tmp_path, "algo-2", hosts_file, hosts=hosts, **settings)
    time.sleep(1.5)
    master = start_host(tmp_path, "algo-1", hosts_file, hosts=hosts, **settings)
    try:
        for host in (master, member):
            exited_at(host, 60)
            assert host.process.returncode == 3, host.stderr()
        assert master.first_line() == (
            f"NetworkError: host(s) algo-3 never joined the job within {join_timeout} s"
        )
        assert member.first_line() == (
            f"host(s) algo-3 never joined the job within {join_timeout} s (the master algo-1 "
            "gave up waiting); algo-2 started no worker because of it"
        )
        assert not (member.tree.output / "data/container-entry/logs").exists()
    finally:
        kill_everything([master, member], [])


@pytest.mark.parametrize("phase", ["reaching the master", "joining", "launching", "training"])
def test_a_stop_at_any_phase_of_one_host_s_start_ends_every_host(tmp_path, root_and_unshare, phase):
    """SIGTERM to algo-2 while it waits to reach the master (once its bootstrap printed its
    plan, before the master starts), waits in the join for algo-3 (2 s: algo-3 never comes),
    launches (once every host joined: algo-3 starts at 3 s), trains (once its rank printed):
    algo-2 exits 143 as a stopped job; the others never hang and name algo-2. (A fixed 0.3 s
    signalled the test's own `unshare` before it had started the bootstrap, on a busy machine.)"""
    hosts = ("algo-1", "algo-2", "algo-3")
    hosts_file = hosts_file_for(tmp_path, dict.fromkeys(hosts, "127.0.0.1"))
    settings = {
        "CONTAINER_ENTRY_MASTER_PORT": str(job_port()),
        "CONTAINER_ENTRY_JOIN_TIMEOUT": "10",
        "PET_NPROC_PER_NODE": "1",
    }
    started = time.monotonic()
    stopped = start_host(tmp_path, "algo-2", hosts_file, hosts=hosts, **settings)
    others: list[Host] = []
    # launching: once every host joined (algo-2 makes its run folder then), not at a fixed
    # time: on a loaded machine algo-3 may join late
    stop_at = {"joining": 2.0}.get(phase)

    def stop_now() -> None:
        """To the bootstrap itself: not before it runs (it prints its plan first), or the
        signal ends the test's own `unshare` wrapper."""
        assert wait_for(lambda: stopped.when("[container-entry] plan"), 60), stopped.stderr()
        stopped.process.send_signal(signal.SIGTERM)

    try:
        if phase == "reaching the master":  # no master yet to reach
            stop_now()
        # while algo-2 waits in the join, algo-3 never comes; else it starts at 3 s
        later = (("algo-1", 1.0),) if phase == "joining" else (("algo-1", 1.0), ("algo-3", 3.0))
        for name, at in later:
            if stop_at is not None and stop_at < at and stopped.process.returncode is None:
                time.sleep(max(0.0, started + stop_at - time.monotonic()))
                stop_now()
                stop_at = None
            time.sleep(max(0.0, started + at - time.monotonic()))
            others.append(start_host(tmp_path, name, hosts_file, hosts=hosts, **settings))
        if stop_at is not None:
            time.sleep(max(0.0, started + stop_at - time.monotonic()))
            stop_now()
        elif phase == "launching":
            run_dir = stopped.tree.output / "data" / "container-entry"
            assert wait_for(run_dir.exists, 60), stopped.stderr()
            stop_now()
        elif phase == "training":
            assert wait_for(lambda: stopped.ranks_started(1), 120), stopped.stderr()
            time.sleep(1.0)
            stop_now()
        exited_at(stopped, 60)
        assert stopped.process.returncode == 143, (phase, stopped.stderr())
        assert "stopped by SIGTERM" in stopped.first_line(), stopped.first_line()
        assert "Traceback" not in stopped.stderr()
        for other in others:
            exited_at(other, 40)
            assert other.process.returncode != 0, other.stderr()
            line = other.first_line()
            print(f"stop while {phase}: {other.name} says {line!r}")
            assert "None" not in line, line
            assert "algo-2" in line, line
            if phase == "training":
                # algo-2 tells the stop, with its moment, before its ranks go: the others'
                # ranks' errors about their leaving (gloo: closed or reset by peer) are its
                # consequences, never the first line; the others stop as a stop does
                assert line.startswith("job stopped by SIGTERM on algo-2"), line
                assert other.process.returncode == 143, other.stderr()
    finally:
        kill_everything([stopped, *others], [])


@pytest.mark.parametrize("victim", ["algo-1", "algo-2"])
def test_a_stop_of_one_host_gives_every_host_s_ranks_the_stop_and_its_grace(
    tmp_path, root_and_unshare, victim
):
    """One host stopped alone (the master, whose torchrun hosts the job's store, or the
    other): its word reaches the other host before its ranks go, and that host's ranks get the
    same SIGTERM and grace, so every rank of the job writes its checkpoint (2 s each, once
    every rank has its SIGTERM, its handler running while its collective is waited for, as
    NCCL's is). Both exit 143; the other host's first line names the stopped host, then how its
    own ranks ended."""
    hosts_file = hosts_file_for(tmp_path, dict.fromkeys(HOSTS, "127.0.0.1"))
    # poll-store: every rank polls the job's store (the master's torchrun) until its process
    # exits, as NCCL's heartbeat thread does, so the store must outlive every host's ranks.
    # term-barrier-dir: each rank's 2 s checkpoint starts once every rank of the job has its
    # SIGTERM (a stopped host's ranks that ended before the other host's had theirs made those
    # raise in their pending all_reduce when one host was stalled for seconds); a stop that
    # never reaches the other host still fails here (its ranks' all_reduce raises)
    work = 2.0
    hps = {
        **TRAINING,
        "checkpoint-on-term": "true",
        "term-work-seconds": str(work),
        "poll-store": "true",
        "term-barrier-dir": json.dumps(str(tmp_path / "terms")),
    }
    # two local ranks a host: the stop must reach every local rank of the other host ("all 2
    # local ranks exited"), not just one
    hosts = start_training(tmp_path, hosts_file, job_port(), hps=hps, PET_NPROC_PER_NODE="2")
    stopped = next(h for h in hosts if h.name == victim)
    other = next(h for h in hosts if h.name != victim)
    try:
        stopped.process.send_signal(signal.SIGTERM)
        for host in hosts:
            exited_at(host, 60)
            assert host.process.returncode == 143, (host.name, host.stderr())
            checkpoints = sorted(p.name for p in (host.tree.base / "checkpoints").iterdir())
            assert checkpoints == ["checkpoint-rank-0.json", "checkpoint-rank-1.json"] or (
                checkpoints == ["checkpoint-rank-2.json", "checkpoint-rank-3.json"]
            ), (host.name, checkpoints, host.stderr())
        assert stopped.first_line().startswith(f"job stopped by SIGTERM on {victim} ("), (
            stopped.first_line()
        )
        line = other.first_line()
        print(f"{victim} stopped: {stopped.first_line()!r}; {other.name}: {line!r}")
        assert line.startswith(f"job stopped by SIGTERM on {victim} ("), line
        within = re.search(rf"; on {other.name}: all 2 local ranks exited within (\S+) s$", line)
        # the checkpoint, then the exits (EXIT_BOUND on a loaded machine, as the other stop
        # tests allow): far below the grace (100 s) that a rank held alive would wait out
        assert within and work <= float(within[1]) < work + EXIT_BOUND, line
        assert "Traceback" not in stopped.stderr() + other.stderr()
    finally:
        kill_everything(hosts, [])
