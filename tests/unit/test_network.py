"""Waiting for host names, with an injected resolver (no DNS), and which names a host waits for."""

import threading
import time
import types
from pathlib import Path

import pytest

from container_entry.common.errors import NetworkError
from container_entry.hosts import network
from container_entry.hosts.session import Session
from container_entry.plan.plan import build_plan
from tests.unit.conftest import make_env, record_backoff

HOSTS = tuple(f"algo-{i}" for i in range(1, 257))


def test_the_deadline_holds_inside_a_pass_of_256_slow_names():
    def slow_and_unknown(name: str) -> bool:
        # a pass takes 640 s serially, 20 s on the 32 threads: the deadline (0.3 s) must not
        # wait for it. Slow enough that the bound below stays far from both a normal wait and
        # a pass, however busy the machine (a thread may stall for seconds beside a CPU hog)
        time.sleep(2.5)
        return False

    started = time.monotonic()
    with pytest.raises(NetworkError) as caught:
        network.wait_for_hosts(HOSTS, 0.3, resolves=slow_and_unknown, interval=0.1)
    took = time.monotonic() - started
    assert 0.3 <= took < 10.0, took  # a parallel pass: 20 s; load: a few s over 0.3 at most
    assert str(caught.value) == (
        "host 'algo-1' did not resolve within 0.3 s (unresolved: algo-1, algo-2, algo-3, "
        "algo-4, algo-5, algo-6, algo-7, algo-8 and 248 more)"
    )


def test_256_names_resolve_in_parallel_with_a_bounded_number_of_lookups():
    running, most, lock = set(), [0], threading.Lock()

    def resolves(name: str) -> bool:
        with lock:
            assert name not in running  # never two lookups of one name at once
            running.add(name)
            most[0] = max(most[0], len(running))
        time.sleep(0.2)  # 32 at once: 1.6 s; serially: 51 s
        with lock:
            running.discard(name)
        return True

    started = time.monotonic()
    # a timeout that load cannot reach: the bound below, not the timeout, tells parallel from
    # serial, far from both (a thread may stall for seconds beside a CPU hog)
    network.wait_for_hosts(HOSTS, 60.0, resolves=resolves, parallel=32)
    assert time.monotonic() - started < 20.0  # serially: 51 s
    assert most[0] <= 32


def test_a_lookup_that_hangs_cannot_hold_the_bootstrap_past_its_timeout():
    never = threading.Event()

    def resolves(name: str) -> bool:
        if name == "algo-2":
            never.wait()  # getaddrinfo stuck on a dead DNS server
        return True

    started = time.monotonic()
    with pytest.raises(NetworkError, match=r"host 'algo-2' did not resolve within 0.3 s"):
        network.wait_for_hosts(("algo-1", "algo-2", "algo-3"), 0.3, resolves=resolves)
    assert time.monotonic() - started < 20.0  # the lookup never returns; 20 s: load's margin
    never.set()


@pytest.mark.parametrize("outcome", ["missing", "found", "raises"])
def test_a_lookup_abandoned_at_the_deadline_schedules_nothing_when_it_returns(monkeypatch, outcome):
    """A lookup still running at the deadline is abandoned (its thread is a daemon). When it
    returns, whatever it found, the wait is over: its thread ends without asking `backoff` for
    a retry nobody waits for. Run 62, beside a CPU hog: a later test in the same process
    counted 29 first retries (0.05 s) besides its own, asked for by the abandoned lookups of
    the 256-name test."""
    release, threads = threading.Event(), []
    in_hand = threading.Event()  # both lookups running

    def resolves(name: str) -> bool:
        threads.append(threading.current_thread())
        if len(threads) >= 2:
            in_hand.set()
        release.wait()
        if outcome == "raises":
            raise OSError("a resolver's error")
        return outcome == "found"

    # The module's clock stands still until both lookups are in hand, then jumps past the
    # deadline: beside a CPU hog a resolver thread started late missed a real 0.2-s deadline.
    # Capped at 60 s of real time, so a wait that never starts both lookups still ends.
    start = time.monotonic()

    def monotonic() -> float:
        if in_hand.is_set() or time.monotonic() - start > 60.0:
            return start + 1000.0
        return start

    monkeypatch.setattr(network, "time", types.SimpleNamespace(monotonic=monotonic))
    with pytest.raises(NetworkError, match=r"host 'algo-1' did not resolve within 0.2 s"):
        network.wait_for_hosts(("algo-1", "algo-2"), 0.2, resolves=resolves, parallel=2)
    monkeypatch.setattr(network, "time", time)
    asked = []  # not record_backoff: it leaves out threads started before it, as these were
    real = network.backoff
    monkeypatch.setattr(network, "backoff", lambda *args: asked.append(args) or real(*args))
    release.set()
    for thread in threads:
        thread.join(60.0)  # released already: 60 s for a loaded machine
        assert not thread.is_alive()
    assert len(threads) == 2 and asked == []


def test_a_name_that_resolves_late_is_retried_until_it_does():
    tries: dict[str, int] = {}

    def resolves(name: str) -> bool:
        tries[name] = tries.get(name, 0) + 1
        return name != "algo-2" or tries[name] >= 3

    network.wait_for_hosts(("algo-1", "algo-2"), 5.0, resolves=resolves, interval=0.05)
    assert tries == {"algo-1": 1, "algo-2": 3}


def test_backoff_doubles_from_50_ms_up_to_its_cap():
    assert [network.backoff(n, 1.0) for n in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert network.backoff(10_000, 0.5) == 0.5  # no overflow however long a peer takes


@pytest.mark.parametrize("missing_for", [1, 2, 4])
def test_a_name_that_appears_late_is_found_within_its_backoff_not_a_whole_interval(
    monkeypatch, missing_for
):
    """Hosts start within a second of each other: a name missing at a lookup is asked again
    after 50, 100, 200 ms ..., so it is found at most about as long again after it appeared,
    not a whole `interval` (1 s) later. Judged on the retries it schedules, not on the wall
    time: beside a busy suite a thread's sleep overshoots (0.93 s where 0.75 s was due, run
    28; a first lookup 20 ms late, run 57)."""
    scheduled = record_backoff(monkeypatch, network)
    asked: list[str] = []

    def resolves(name: str) -> bool:
        if name != "algo-2":
            return True
        asked.append(name)
        return len(asked) > missing_for  # missing at its first `missing_for` lookups

    network.wait_for_hosts(("algo-1", "algo-2"), 30.0, resolves=resolves, interval=1.0)
    assert len(asked) == missing_for + 1
    assert scheduled == [0.05, 0.1, 0.2, 0.4][:missing_for], scheduled  # never a whole 1 s


class Resolved(Exception):
    pass


def names_waited_for(monkeypatch, tmp_path: Path, hosts, current, **hps) -> tuple[str, ...]:
    waited: list[tuple[str, ...]] = []

    def record(names, timeout, **_):
        waited.append(tuple(names))
        raise Resolved  # stop before the side channel: only the names matter here

    monkeypatch.setattr(network, "wait_for_hosts", record)
    config = {"current_host": current, "hosts": list(hosts), "network_interface_name": "eth0"}
    plan = build_plan(make_env(resource_config=config, hyperparameters=hps))
    with pytest.raises(Resolved):
        Session(plan, key=b"").join()
    return waited[0]


def test_a_host_waits_for_the_master_s_name_only(monkeypatch, tmp_path):
    assert names_waited_for(monkeypatch, tmp_path, HOSTS, "algo-200") == ("algo-1",)
    assert names_waited_for(monkeypatch, tmp_path, HOSTS, "algo-1") == ("algo-1",)


def test_under_c10d_every_name_is_waited_for(monkeypatch, tmp_path):
    # with restarts each host advertises its own name to the workers of every other
    waited = names_waited_for(
        monkeypatch, tmp_path, HOSTS, "algo-7", container_entry_max_restarts="1"
    )
    assert sorted(waited) == sorted(HOSTS)
