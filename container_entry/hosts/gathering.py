"""Every host's flight-recorder records at the master, for the hang's culprit (culprit.py).

After a hang verdict each host asks its ranks for their records (flight_recorder.py) and posts
them, cut to what the analysis needs, as one `records` message. The master lines up every
host's, once all hosts still in the job sent theirs or GATHER_SECONDS after the first arrived,
and sends every host the verdict's words (`culprit`; none where the records name no one).
Bounded in size (the master's line limit: the oldest calls go first) and in time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from container_entry.diagnose.culprit import Call, RankCalls, analyse
from container_entry.hosts.schema import NAME_CAP, SHORT_CAP, TEXT_CAP, integer, number, text
from container_entry.hosts.wire import LINE_LIMIT, Invalid, encode

GATHER_SECONDS = 8.0  # after the first host's records, for the others'
# a host's wait for the master's culprit: GATHER_SECONDS and the hosts' own dump waits
CULPRIT_WAIT = 12.0
WIRE_CALLS = 16  # per rank and group on the wire: a hang needs the tail of each sequence
MAX_RANKS = 512  # in one host's message
MAX_GROUPS = 64
MAX_TENSORS = 16
MAX_DIMS = 8


def to_wire(rank: RankCalls, calls: int = WIRE_CALLS) -> dict[str, Any]:
    by_group: dict[str, list[Call]] = {}
    for call in rank.calls:
        by_group.setdefault(call.group, []).append(call)
    kept = [c for group in by_group.values() for c in sorted(group, key=lambda c: c.seq)[-calls:]]
    return {
        "rank": rank.rank,
        "where": rank.where,
        "groups": {name: [desc, list(ranks)] for name, (desc, ranks) in rank.groups.items()},
        "calls": [
            [c.group, c.seq, c.op, [list(s) for s in c.shapes], list(c.dtypes), c.done, c.created]
            for c in kept
        ],
    }


def fitted_ranks(ranks: Sequence[RankCalls]) -> list[dict[str, Any]]:
    """This host's ranks on the wire, halving the calls kept until the line fits."""
    calls = WIRE_CALLS
    while True:
        wire = [to_wire(rank, calls) for rank in ranks[:MAX_RANKS]]
        if calls <= 1 or len(encode({"type": "records", "ranks": wire})) <= LINE_LIMIT:
            return wire
        calls //= 2


def from_wire(value: Any, host: str) -> list[RankCalls]:
    """A host's `records`, checked field by field (Invalid says what is wrong)."""
    if not isinstance(value, list) or len(value) > MAX_RANKS:
        raise Invalid(f"records is not a list of at most {MAX_RANKS} ranks")
    return [_rank(item, host) for item in value]


def _rank(item: Any, host: str) -> RankCalls:
    if not isinstance(item, dict) or set(item) != {"rank", "where", "groups", "calls"}:
        raise Invalid("a record is not {rank, where, groups, calls}")
    groups = item["groups"]
    if not isinstance(groups, dict) or len(groups) > MAX_GROUPS:
        raise Invalid(f"record groups is not an object of at most {MAX_GROUPS}")
    calls = item["calls"]
    if not isinstance(calls, list) or len(calls) > WIRE_CALLS * MAX_GROUPS:
        raise Invalid("record calls is not a list of bounded length")
    return RankCalls(
        rank=integer(item["rank"], "record rank", 0, 1 << 31),
        host=host,
        calls=[_call(call) for call in calls],
        groups={text(n, "group", NAME_CAP, none=False): _group(g) for n, g in groups.items()},
        where=text(item["where"], "record where", TEXT_CAP),
    )


def _group(value: Any) -> tuple[str, tuple[int, ...]]:
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], list):
        raise Invalid("a record group is not [desc, ranks]")
    if len(value[1]) > 1 << 16:
        raise Invalid("a record group lists too many ranks")
    ranks = tuple(integer(r, "group rank", 0, 1 << 31) for r in value[1])
    return text(value[0], "group desc", NAME_CAP, none=False), ranks


def _call(value: Any) -> Call:
    if not isinstance(value, list) or len(value) != 7:
        raise Invalid("a record call is not [group, seq, op, shapes, dtypes, done, created]")
    group, seq, op, shapes, dtypes, done, created = value
    if not isinstance(shapes, list) or len(shapes) > MAX_TENSORS:
        raise Invalid("a record call's shapes are not a bounded list")
    if not isinstance(dtypes, list) or len(dtypes) > MAX_TENSORS or not isinstance(done, bool):
        raise Invalid("a record call's dtypes or done are malformed")
    return Call(
        group=text(group, "call group", NAME_CAP, none=False),
        seq=integer(seq, "call seq", 0, 1 << 62),
        op=text(op, "call op", SHORT_CAP, none=False),
        shapes=tuple(_shape(shape) for shape in shapes),
        dtypes=tuple(text(d, "call dtype", SHORT_CAP, none=False) for d in dtypes),
        done=done,
        created=number(created, "call created", 0, 1e11),
    )


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_DIMS:
        raise Invalid("a record call's shape is not a bounded list")
    return tuple(integer(d, "call dim", 0, 1 << 62) for d in value)


class Gathering:
    """The master's collection of every host's records."""

    def __init__(self, seconds: float = GATHER_SECONDS) -> None:
        self.seconds = seconds
        self.ranks: dict[str, list[RankCalls]] = {}
        self.since: float | None = None  # the first host's records arrived
        self.said = False  # the culprit went out

    def offer(self, host: str, ranks: list[RankCalls], now: float) -> None:
        self.ranks[host] = ranks
        if self.since is None:
            self.since = now

    def due(self, hosts: Iterable[str], now: float) -> bool:
        """Time to say it: every host still in the job sent its records, or the wait is over."""
        if self.said or self.since is None:
            return False
        return set(hosts) <= set(self.ranks) or now - self.since >= self.seconds

    def verdict(self) -> str | None:
        self.said = True
        return analyse([rank for ranks in self.ranks.values() for rank in ranks])
