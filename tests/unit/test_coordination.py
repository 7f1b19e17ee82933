"""The hosts' side channel over real loopback sockets (no processes, no torch).

Liveness runs with short timeouts here (LIVENESS seconds of silence); the bootstrap's own are
in coordination.py (10 s, heartbeats every second). A "killed" host is a raw socket that joins
and closes, as the kernel does for a process killed with SIGKILL; a "frozen" one is a raw socket
that joins and then never says anything again (SIGSTOP, a hung machine, a cut network)."""

import json
import socket
import threading
import time

import pytest

from container_entry.coordination import Coordinator, Member, PeerFailure, tune
from container_entry.errors import NetworkError
from container_entry.records import RankRecord

LIVENESS = 0.3
BEAT = 0.05
FAST = {"liveness_timeout": LIVENESS, "interval": BEAT}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def member(host: str, port: int) -> Member:
    return Member(host, "127.0.0.1", port, **FAST)


def join_all(members, timeout=10.0):
    threads = [threading.Thread(target=m.join, args=(timeout,)) for m in members]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(m.started.is_set() for m in members)


def background_join(m: Member, timeout: float) -> list[BaseException]:
    """Join in a thread; what it raised lands in the returned list."""
    raised: list[BaseException] = []

    def run():
        try:
            m.join(timeout)
        except BaseException as error:
            raised.append(error)

    threading.Thread(target=run, daemon=True).start()
    return raised


def raw_join(host: str, port: int) -> socket.socket:
    """A host's bootstrap that joins and then says nothing more (frozen, or about to be
    killed)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall((json.dumps({"type": "join", "host": host}) + "\n").encode())
    return sock


def test_failure_is_relayed_and_the_master_stops_waiting_once_peers_leave():
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2"), port, **FAST)
    one, two = member("algo-1", port), member("algo-2", port)
    join_all([one, two])
    two.post_failure(RankRecord(host="algo-2", rank=3, returncode=1))
    assert one.aborted.wait(5) and one.abort is not None and one.abort.rank == 3
    two.close()
    one.close()
    started = time.monotonic()
    coordinator.wait_finished(5.0)
    assert time.monotonic() - started < 1.0  # every host closed its channel: no fixed wait
    assert coordinator.vanished == {}  # hosts leaving after a failure did not vanish
    coordinator.close()


def test_a_host_that_never_joins_is_named():
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2"), port, **FAST)
    master = member("algo-1", port)
    with pytest.raises(NetworkError, match=r"not every host joined the job within 0\.3 s"):
        master.join(0.3)
    assert coordinator.missing() == ["algo-2"]
    master.close()
    coordinator.close()


def test_a_killed_host_is_a_failure_naming_it_at_once():
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2", "algo-3"), port, **FAST)
    one, two = member("algo-1", port), member("algo-2", port)
    three = raw_join("algo-3", port)
    join_all([one, two])
    killed = time.monotonic()
    three.close()  # SIGKILL: the kernel closes the socket, the peer sees the FIN
    assert one.aborted.wait(5) and two.aborted.wait(5)
    noticed = time.monotonic() - killed
    assert noticed < LIVENESS  # no need to wait for the silence
    assert one.abort is not None and one.abort.host == "algo-3"
    assert one.abort.what.startswith("host algo-3 left the job without a word")
    assert not one.lost_master
    for m in (one, two):
        m.close()
    coordinator.close()


def test_a_frozen_host_is_noticed_after_the_liveness_timeout_and_named():
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2", "algo-3"), port, **FAST)
    one, two = member("algo-1", port), member("algo-2", port)
    frozen = raw_join("algo-3", port)  # its socket stays open: only heartbeats tell
    join_all([one, two])
    since = time.monotonic()
    assert two.aborted.wait(5)
    took = time.monotonic() - since
    assert LIVENESS * 0.5 <= took <= LIVENESS + 3 * BEAT + 0.3, took
    assert two.abort is not None and two.abort.what == (
        f"host algo-3 stopped answering (no heartbeat for {LIVENESS:g} s): its bootstrap died, "
        "froze or lost the network"
    )
    assert two.abort.returncode != 0 and two.abort.rank is None
    assert coordinator.vanished == {"algo-3": f"no heartbeat for {LIVENESS:g} s"}
    for m in (one, two):
        m.close()
    frozen.close()
    coordinator.close()


def test_the_master_does_not_wait_for_a_frozen_host_at_finish():
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2"), port, **FAST)
    one = member("algo-1", port)
    frozen = raw_join("algo-2", port)
    one.join(5)
    one.done()
    one.close()
    started = time.monotonic()
    coordinator.wait_finished(60.0)
    assert time.monotonic() - started < LIVENESS + 1.0
    frozen.close()
    coordinator.close()


def frozen_master(port: int, *, say_start: bool) -> tuple[socket.socket, list[socket.socket]]:
    """A master's bootstrap that accepts (the kernel does that) and then says nothing more."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen()
    accepted: list[socket.socket] = []

    def accept():
        connection, _ = server.accept()
        accepted.append(connection)
        if say_start:
            connection.sendall(b'{"type": "start"}\n')

    threading.Thread(target=accept, daemon=True).start()
    return server, accepted


def test_a_member_notices_a_frozen_master():
    port = free_port()
    server, accepted = frozen_master(port, say_start=True)
    two = member("algo-2", port)
    two.join(5)
    since = time.monotonic()
    assert two.aborted.wait(5)
    assert LIVENESS * 0.5 <= time.monotonic() - since <= LIVENESS + 0.6
    assert two.lost_master and two.lost_reason == f"no heartbeat for {LIVENESS:g} s"
    two.close()
    server.close()
    for connection in accepted:
        connection.close()


def test_a_master_that_freezes_during_the_join_is_reported_at_once_not_at_the_join_timeout():
    port = free_port()
    server, accepted = frozen_master(port, say_start=False)
    two = member("algo-2", port)
    started = time.monotonic()
    with pytest.raises(NetworkError, match=r"the master host 127\.0\.0\.1 stopped answering"):
        two.join(30)
    assert time.monotonic() - started < LIVENESS + 1.0
    two.close()
    server.close()
    for connection in accepted:
        connection.close()


def test_a_member_hears_the_master_s_verdict_on_who_never_joined_in_its_own_words():
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2", "algo-3"), port, **FAST)
    master, two = member("algo-1", port), member("algo-2", port)
    outcome: list[BaseException] = []

    def join_two():
        try:
            two.join(0.2, verdict_grace=3.0)  # its own timeout passes first: it must wait
        except BaseException as error:
            outcome.append(error)

    joining = threading.Thread(target=join_two)
    joining.start()
    with pytest.raises(NetworkError):
        master.join(0.4)
    assert coordinator.missing() == ["algo-3"]
    master.post_failure(
        RankRecord(
            host="algo-1",
            rank=None,
            returncode=3,
            what="host(s) algo-3 never joined the job within 0.4 s (the master algo-1 gave up "
            "waiting)",
        )
    )
    joining.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], PeerFailure)
    assert str(outcome[0]) == (
        "host(s) algo-3 never joined the job within 0.4 s (the master algo-1 gave up waiting); "
        "algo-2 started no worker because of it"
    )
    assert outcome[0].exit_code == 3
    assert "None" not in str(outcome[0])
    for m in (master, two):
        m.close()
    coordinator.close()


def test_a_member_that_gives_up_first_names_who_the_master_waited_for():
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2", "algo-3"), port, **FAST)
    two = member("algo-2", port)
    with pytest.raises(NetworkError) as caught:
        two.join(0.3)
    assert str(caught.value) == (
        "not every host joined the job within 0.3 s: the master 127.0.0.1 was still waiting "
        "for algo-1, algo-3"
    )
    two.close()
    coordinator.close()


def test_a_host_joining_after_a_failure_hears_it_at_once():
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2", "algo-3"), port, **FAST)
    one, two = member("algo-1", port), member("algo-2", port)
    raised = [background_join(m, 0.3) for m in (one, two)]
    time.sleep(0.1)
    one.post_failure(RankRecord(host="algo-1", rank=None, returncode=2, what="CodeError: x"))
    assert two.aborted.wait(2) and not one.aborted.is_set()  # the poster hears no echo
    late = member("algo-3", port)
    started = time.monotonic()
    with pytest.raises(PeerFailure, match="algo-1: CodeError: x; algo-3 started no worker"):
        late.join(30)
    assert time.monotonic() - started < 1.0
    time.sleep(0.3)
    assert isinstance(raised[1][0], PeerFailure)  # two heard it during its own join
    for m in (one, two, late):
        m.close()
    coordinator.close()


def test_a_failure_reaches_64_hosts_within_a_second_and_the_master_uses_one_thread():
    hosts = [f"algo-{i}" for i in range(1, 65)]
    port = free_port()
    before = set(threading.enumerate())  # other tests' threads may end meanwhile: new ones
    coordinator = Coordinator(hosts, port, liveness_timeout=5.0, interval=0.2)
    assert [t.name for t in set(threading.enumerate()) - before] == ["coordinator"]
    members = [Member(h, "127.0.0.1", port, liveness_timeout=5.0, interval=0.2) for h in hosts]
    join_all(members)
    sent = time.monotonic()
    members[17].post_failure(RankRecord(host="algo-18", rank=70, local_rank=0, returncode=1))
    assert all(m.aborted.wait(2) for m in members if m is not members[17])
    assert time.monotonic() - sent < 1.0
    assert all(m.abort is not None and m.abort.rank == 70 for m in members if m.abort)
    for m in members:
        m.close()
    coordinator.close()


def test_the_side_channel_asks_the_kernel_to_end_a_dead_connection():
    with socket.socket() as sock:
        tune(sock, 10.0)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 10000
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5


def test_the_start_tells_each_host_who_shares_its_machine():
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2", "algo-3"), port)
    members = [
        Member("algo-1", "127.0.0.1", port, machine="boot-a", workers=2),
        Member("algo-2", "127.0.0.1", port, machine="boot-a", workers=2),
        Member("algo-3", "127.0.0.1", port, machine="boot-b", workers=4),
    ]
    threads = [threading.Thread(target=m.join, args=(10,)) for m in members]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [m.machine_share() for m in members] == [(2, 4), (2, 4), (1, 4)]
    for member in members:
        member.close()
    coordinator.close()


@pytest.mark.parametrize("master_late_by", [0.1, 0.6])
def test_a_member_up_before_the_master_joins_soon_after_the_master_listens(master_late_by):
    """Hosts start in any order: a member whose first connection is refused asks again with a
    short backoff (50 ms, doubling, at most 0.5 s), so its join is not held a fixed retry
    interval after the master's side channel opened."""
    port = free_port()
    hosts = ("algo-1", "algo-2")
    two = member("algo-2", port)
    raised = background_join(two, 10.0)
    time.sleep(master_late_by)
    opened = time.monotonic()
    coordinator = Coordinator(hosts, port, **FAST)
    one = member("algo-1", port)
    join_all([one])
    assert two.started.wait(5) and not raised
    # tries at 0, 0.05, 0.15, 0.35, 0.75 s: at most 0.15 s after the master opened at 0.6 s
    # (a fixed 0.5 s retry joins 0.4 s after it, in both cases)
    assert time.monotonic() - opened < 0.3
    for m in (one, two):
        m.close()
    coordinator.close()
