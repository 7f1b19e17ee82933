"""Every host's flight-recorder records at the master (hosts.gathering), over real
loopback sockets for the flow and on values for the schema: a hang's culprit named on every
host from records no single host holds, records of any shape refused without harm, and a line
that never exceeds the master's limit."""

from __future__ import annotations

import json
import threading
import time

import pytest

from container_entry.diagnose.culprit import Call, RankCalls
from container_entry.hosts import Coordinator, Member
from container_entry.hosts.gathering import Gathering, fitted_ranks, from_wire, to_wire
from container_entry.hosts.wire import LINE_LIMIT, Invalid, encode
from tests.unit.test_coordination import FAST, free_port, join_all


def calls(last: int, pending: bool, op: str = "all_reduce") -> list[Call]:
    done = [Call("0", seq, op, ((4096,),), ("float32",), True, 1e9 + seq) for seq in range(1, last)]
    return [*done, Call("0", last, op, ((4096,),), ("float32",), not pending, 1e9 + last)]


def rank(number: int, host: str, last: int, pending: bool, where: str | None = None) -> RankCalls:
    return RankCalls(number, host, calls(last, pending), {"0": ("default_pg", (0, 1, 2, 3))}, where)


def test_the_master_names_the_culprit_on_every_host_from_every_host_s_records():
    """algo-1's ranks wait in all_reduce #6; algo-2's rank 3 never entered it: only the master,
    holding both hosts' records, can say so, and every host hears it."""
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2"), port, **FAST)
    one, two = (Member(h, "127.0.0.1", port, **FAST) for h in ("algo-1", "algo-2"))
    join_all([one, two])
    one.post_records([rank(0, "ignored", 6, True), rank(1, "ignored", 6, True)])
    assert two.hang_culprit(0.3) is None  # one host's records alone: the master still waits
    two.post_records([rank(2, "x", 6, True), rank(3, "x", 5, False, "train.py:88 in evaluate")])
    words = [m.hang_culprit(30.0) for m in (one, two)]
    assert words[0] == words[1]
    assert words[0].startswith("rank 3 on algo-2 never entered all_reduce #6 of the default group")
    assert words[0].endswith("rank 3 was at train.py:88 in evaluate")
    for member in (one, two):
        member.close()
    coordinator.close()


def test_a_host_waiting_for_the_culprit_stops_waiting_when_the_master_is_gone():
    """Hosts wait for the master's word before they end their ranks (supervisor._sharer): a
    master that goes away mid-wait must not hold a host for the whole wait."""
    port = free_port()
    coordinator = Coordinator(("algo-1", "algo-2"), port, **FAST)
    two = Member("algo-2", "127.0.0.1", port, **FAST)
    one = Member("algo-1", "127.0.0.1", port, **FAST)
    join_all([one, two])
    two.post_records([rank(2, "x", 6, True)])
    waited: list[float] = []
    waiter = threading.Thread(
        target=lambda: waited.append(timed(lambda: two.hang_culprit(30.0))), daemon=True
    )
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()  # algo-1's records are missing: the master still waits
    coordinator.close()
    waiter.join(60.0)
    assert waited and waited[0] < 20.0, waited  # the master's close, not the 30-s wait
    assert two.culprit is None
    for member in (one, two):
        member.close()


def timed(work) -> float:
    started = time.monotonic()
    work()
    return time.monotonic() - started


def test_a_host_that_never_sends_does_not_hold_the_verdict_past_the_wait():
    gathering = Gathering(seconds=2.0)
    gathering.offer("algo-1", [rank(0, "algo-1", 3, True)], now=100.0)
    assert not gathering.due(["algo-1", "algo-2"], now=101.0)
    assert gathering.due(["algo-1", "algo-2"], now=102.0)
    assert gathering.verdict() is not None and not gathering.due(["algo-1"], now=103.0)


def test_records_cross_the_wire_unchanged_and_fit_the_master_s_line():
    many = [
        RankCalls(r, "algo-1", [Call(str(g), s, "all_reduce", ((1 << 20, 8),), ("bfloat16",), True,
                                1.7e9) for g in range(8) for s in range(200)],
             {str(g): (f"tp{g}", tuple(range(64))) for g in range(8)}, "train.py:1 in <module>")
        for r in range(8)
    ]  # fmt: skip
    wire = fitted_ranks(many)
    assert len(encode({"type": "records", "ranks": wire})) <= LINE_LIMIT
    back = from_wire(json.loads(json.dumps(wire)), "algo-2")
    assert [r.rank for r in back] == list(range(8)) and back[0].host == "algo-2"
    assert back[0].calls[-1] == many[0].calls[-1]  # the newest calls are the ones kept
    small = rank(0, "algo-1", 3, True, "t.py:1 in f")
    assert from_wire([to_wire(small)], "algo-1")[0] == small


@pytest.mark.parametrize(
    "bad",
    [
        "x",
        [1],
        [{"rank": 0}],
        [{"rank": -1, "where": None, "groups": {}, "calls": []}],
        [{"rank": 0, "where": None, "groups": [], "calls": []}],
        [{"rank": 0, "where": None, "groups": {}, "calls": [["0", 1, "op"]]}],
        [
            {
                "rank": 0,
                "where": None,
                "groups": {},
                "calls": [["0", 1, "op", [[1] * 99], [], True, 1]],
            }
        ],
        [{"rank": 0, "where": None, "groups": {"0": ["d", list(range(70000))]}, "calls": []}],
        [{"rank": 0, "where": "x" * 5000, "groups": {}, "calls": []}],
        [{"rank": 0, "where": None, "groups": {}, "calls": [["0", 1, "op", [], [], "yes", 1]]}],
    ],
)
def test_records_of_any_other_shape_are_refused_with_a_reason(bad):
    with pytest.raises(Invalid):
        from_wire(bad, "algo-1")
