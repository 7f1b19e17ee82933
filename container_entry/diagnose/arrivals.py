"""What each host sends of its ranks' collective records for the straggler analysis
(stragglers.py): pure, stdlib only.

Per rank and interval, `summarize` keeps of its flight-recorder dump (flight_recorder.py) only
what lines collectives up across ranks: per process group, the sequence number and entry time
(and, on NCCL with TORCH_NCCL_ENABLE_TIMING=1, the duration) of its newest completed collectives
not sent before. The master puts each summary on its own clock (`shift`) and keeps what it got
per rank (`merge`). Records are parsed by culprit.py's `calls_of`, the one reader of torch's
dump format.

Size: a collective costs 8 bytes of compact JSON (a sequence delta, a microsecond delta; 14 with
NCCL's duration), a group about 100 more; a rank's summary never exceeds `budget` (RANK_BUDGET,
7 KiB: a host's 8 ranks fit the side channel's 64 KiB line to the master). For 256 hosts x 8
ranks, 2 groups and LIMIT (64) collectives each, with durations: 2 KiB a rank, 16 KiB a host,
4 MiB at the master per interval (1.3 KiB, 10 KiB and 2.5 MiB without); never more than 56 KiB
a host and 14 MiB at the master (tests/unit/test_stragglers.py measures both).
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from container_entry.diagnose.culprit import Call, calls_of, groups_of

LIMIT = 64  # collectives a rank sends per group and interval: plenty for a median and a share
MAX_GROUPS = 8  # groups a rank sends (the most recently active): DP, TP, PP, EP, CP and more
RANK_BUDGET = 7 * 1024  # bytes of a rank's summary: 8 of them in one 64 KiB side-channel line
MAX_RANKS = 1 << 20  # members a received group may list (its ranges unrolled)


def on_master_clock(seconds: float, offset_seconds: float) -> float:
    """A time of a host's clock on the master's. `offset_seconds` is what the side channel
    measures of that host (hosts/liveness.py, `Peer.skew`): the master's clock less the host's,
    so positive when the host's clock is behind. The one place that sign lives."""
    return seconds + offset_seconds


@dataclass(frozen=True)
class Arrivals:
    """One rank's newest completed collectives in one process group."""

    name: str  # the group's name ("0": the default group)
    desc: str = ""
    ranks: tuple[int, ...] = ()  # its members (global ranks) where the dump says; gloo does not
    seqs: tuple[int, ...] = ()
    entered: tuple[float, ...] = ()  # epoch seconds: the host's clock, the master's after shift
    durations: tuple[float | None, ...] = ()  # NCCL's, in seconds; () where none has one

    def entries(self, after: int = 0) -> dict[int, tuple[float, float | None]]:
        """seq -> (entered, duration), for the sequence numbers above `after`."""
        durations = self.durations or (None,) * len(self.seqs)
        return {
            s: (t, d)
            for s, t, d in zip(self.seqs, self.entered, durations, strict=True)
            if s > after
        }


@dataclass(frozen=True)
class RankArrivals:
    """What a host sends of one rank per interval (`summarize`)."""

    rank: int
    local_rank: int
    host: str
    gpu: int | None = None
    groups: tuple[Arrivals, ...] = ()

    def newest(self) -> dict[str, int]:
        """The `since_seq` of this rank's next summary."""
        return {g.name: g.seqs[-1] for g in self.groups if g.seqs}

    def to_json(self) -> dict[str, Any]:
        """Compact: sequence numbers and microsecond times as deltas from the one before."""
        return {
            "rank": self.rank,
            "local": self.local_rank,
            "host": self.host,
            "gpu": self.gpu,
            "groups": [_group_json(g) for g in self.groups],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankArrivals:
        """The summary a host sent; ValueError when it is not one."""
        try:
            groups = tuple(_group_from(g) for g in data["groups"])
            gpu = data.get("gpu")
            return cls(
                int(data["rank"]),
                int(data["local"]),
                str(data["host"]),
                None if gpu is None else int(gpu),
                groups,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"not a rank's arrivals: {error!r}") from None


def _group_json(group: Arrivals) -> dict[str, Any]:
    micros = [round(t * 1e6) for t in group.entered]
    found: dict[str, Any] = {
        "name": group.name,
        "desc": group.desc,
        "ranks": _runs(group.ranks),
        "seq": _deltas(list(group.seqs)),
        "us": _deltas(micros),
    }
    if group.durations:
        found["dur"] = [None if d is None else round(d * 1e6) for d in group.durations]
    return found


def _group_from(data: Mapping[str, Any]) -> Arrivals:
    seqs = _sums(data["seq"])
    entered = tuple(us / 1e6 for us in _sums(data["us"]))
    durations = tuple(None if d is None else float(d) / 1e6 for d in data.get("dur") or ())
    if len(entered) != len(seqs) or (durations and len(durations) != len(seqs)):
        raise ValueError("lists of different lengths")
    if any(b <= a for a, b in itertools.pairwise(seqs)):
        raise ValueError("sequence numbers not increasing")
    runs = [range(start, stop, step) for start, stop, step in data["ranks"]]
    if sum(len(run) for run in runs) > MAX_RANKS:
        raise ValueError(f"a group of more than {MAX_RANKS} ranks")
    ranks = tuple(r for run in runs for r in run)
    return Arrivals(str(data["name"]), str(data["desc"]), ranks, seqs, entered, durations)


def _deltas(values: list[int]) -> list[int]:
    return [v - p for v, p in zip(values, [0, *values[:-1]], strict=True)]


def _sums(deltas: Iterable[Any]) -> tuple[int, ...]:
    total, found = 0, []
    for delta in deltas:
        total += int(delta)
        found.append(total)
    return tuple(found)


def _runs(ranks: Sequence[int]) -> list[list[int]]:
    """[0, 8, 16, 24] as [[0, 32, 8]] (range's start, stop, step): the default group of 2048
    ranks costs a few bytes, not 10 KB."""
    runs: list[list[int]] = []  # [start, last, step]
    for rank in sorted(set(ranks)):
        run = runs[-1] if runs else None
        if run is not None and run[0] == run[1]:
            run[1:] = [rank, rank - run[0]]
        elif run is not None and rank - run[1] == run[2]:
            run[1] = rank
        else:
            runs.append([rank, rank, 1])
    return [[start, last + step, step] for start, last, step in runs]


def summarize(
    rank: int,
    local_rank: int,
    host: str,
    dump: Mapping[str, Any],
    since_seq: Mapping[str, int] | None,
    limit: int = LIMIT,
    *,
    gpu: int | None = None,
    budget: int = RANK_BUDGET,
) -> RankArrivals:
    """One rank's dump (flight_recorder.py) as the little the analysis needs: per group, its
    newest `limit` completed collectives after `since_seq[group]` (a collective still running
    is sent once it completed, with its duration). A group whose records stop below its
    `since_seq` was made anew (counted from 1 again): all of it is new. At most MAX_GROUPS
    groups (the most recently active) and `budget` bytes (the oldest entries go first)."""
    since = since_seq or {}
    described = groups_of(dump)
    by_group: dict[str, list[Call]] = {}
    for call in calls_of(dump, limit=sys.maxsize):
        if call.done and call.created:
            by_group.setdefault(call.group, []).append(call)
    chosen = []
    for name, calls in by_group.items():
        after = since.get(name, 0)
        after = 0 if calls[-1].seq < after else after
        new = [c for c in calls if c.seq > after][-limit:] if limit > 0 else []
        if new:
            desc, members = described.get(name, ("", ()))
            chosen.append(_arrivals(name, desc or new[-1].group_desc, members, new))
    chosen.sort(key=lambda g: -g.entered[-1])
    groups = tuple(sorted(chosen[:MAX_GROUPS], key=lambda g: (g.name != "0", g.name)))
    return _within(RankArrivals(rank, local_rank, host, gpu, groups), budget)


def _arrivals(name: str, desc: str, members: tuple[int, ...], calls: list[Call]) -> Arrivals:
    durations = tuple(c.duration for c in calls)
    return Arrivals(
        name,
        desc,
        members,
        tuple(c.seq for c in calls),
        tuple(c.created or 0.0 for c in calls),
        durations if any(d is not None for d in durations) else (),
    )


def encoded(arrivals: RankArrivals) -> bytes:
    """The summary as the side channel carries it (compact JSON): its size is what counts."""
    return json.dumps(arrivals.to_json(), separators=(",", ":")).encode()


def _within(arrivals: RankArrivals, budget: int) -> RankArrivals:
    """The summary in at most `budget` bytes: the oldest entries of the longest group go."""
    while (size := len(encoded(arrivals))) > budget and arrivals.groups:
        longest = max(arrivals.groups, key=lambda g: len(g.seqs))
        drop = max(1, math.ceil(len(longest.seqs) * (1 - budget / size)))
        kept = _tail(longest, len(longest.seqs) - drop)
        groups = [kept if g is longest else g for g in arrivals.groups]
        arrivals = replace(arrivals, groups=tuple(g for g in groups if g.seqs))
    return arrivals


def _tail(group: Arrivals, count: int) -> Arrivals:
    count = max(count, 0)
    return replace(
        group,
        seqs=group.seqs[len(group.seqs) - count :],
        entered=group.entered[len(group.entered) - count :],
        durations=group.durations[len(group.durations) - count :] if group.durations else (),
    )


def shift(arrivals: RankArrivals, offset_seconds: float) -> RankArrivals:
    """The summary with its entry times on the master's clock (`on_master_clock`)."""
    groups = tuple(
        replace(g, entered=tuple(on_master_clock(t, offset_seconds) for t in g.entered))
        for g in arrivals.groups
    )
    return replace(arrivals, groups=groups)


def merge(held: RankArrivals | None, new: RankArrivals, keep: int = 4 * LIMIT) -> RankArrivals:
    """What the master holds of one rank: `new` over `held`, the newest `keep` per group (a
    collective one member reported in one interval and another in the next still lines up).
    A group whose new numbers stop below what was held was made anew: the old life goes."""
    if held is None:
        return new
    old = {g.name: g for g in held.groups}
    groups = []
    for group in new.groups:
        before = old.pop(group.name, None)
        entries = group.entries()
        made_anew = before and before.seqs and group.seqs and group.seqs[-1] < before.seqs[-1]
        if before is not None and not made_anew:
            entries = {**before.entries(), **entries}
        seqs = sorted(entries)[-keep:]
        timed = any(entries[s][1] is not None for s in seqs)
        groups.append(
            replace(
                group,
                seqs=tuple(seqs),
                entered=tuple(entries[s][0] for s in seqs),
                durations=tuple(entries[s][1] for s in seqs) if timed else (),
            )
        )
    return replace(new, groups=tuple(sorted([*groups, *old.values()], key=lambda g: g.name)))
