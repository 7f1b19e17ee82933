"""The slowest rank, named while the job runs, from the ranks' own collective records: pure.

The flow (docs/stragglers.md): every interval each host `summarize`s its ranks' flight-recorder
dumps (arrivals.py: per process group, the sequence number and entry time of the newest
completed collectives not sent before, never the whole dump). The master puts each host's
summaries on its own clock (`shift`, with the offset the side channel measured), keeps them per
rank (`merge`), lines the same collective (group, sequence number) up across the group's members
and measures who came last (`analyse`, from `after` on, so each collective counts once), and
prints `verdict`'s line; `cost` is the end-of-job figure.

Which time: `time_created_ns`, filled on every backend as the rank's CPU enters the collective;
on NCCL with TORCH_NCCL_ENABLE_TIMING=1 each retired record also has `duration_ms`, from the
rank's GPU reaching the collective to its end, and as every member's kernel ends together, the
member with the shortest duration arrived last: its lag is the longest duration less its own,
on the GPU's clock, with no host clocks involved. Where every member of a collective has one,
the analysis reads `duration_ms` ("gpu"), else `time_created_ns` ("cpu").

Size (arrivals.py): 8 bytes a collective (14 with a duration); for 256 hosts x 8 ranks, 2
groups and 64 collectives each, 16 KiB a host and 4 MiB at the master per interval, never more
than 56 KiB a host (the side channel's line is 64 KiB) and 14 MiB at the master.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from container_entry.diagnose.arrivals import (
    LIMIT,
    RANK_BUDGET,
    Arrivals,
    RankArrivals,
    encoded,
    merge,
    on_master_clock,
    shift,
    summarize,
)
from container_entry.diagnose.culprit import group_name, ranges

__all__ = [
    "LIMIT",
    "RANK_BUDGET",
    "Arrivals",
    "GroupTable",
    "RankArrivals",
    "Row",
    "Table",
    "analyse",
    "cost",
    "encoded",
    "merge",
    "named",
    "on_master_clock",
    "shift",
    "shown",
    "straggler_line",
    "summarize",
    "verdict",
    "who",
]

MIN_COLLECTIVES = 20  # fewer lined-up collectives in a group say nothing yet
# A straggler is last on most collectives, late by far more than noise, and costs the others
# time. A balanced job spreads "last" over its ranks (half each with two), its ranks jitter by a
# few ms (a loaded 2-CPU machine; the side channel's clock offsets are good to about a ms), and
# its waiting is a few percent at most; a rank slowed by 100 ms per collective passes all three.
LAST_SHARE = 0.75
MIN_LAG = 0.020  # seconds behind the first arrival (median)
MIN_WAIT = 0.03  # share of the others' time spent waiting: "cost the job more than a few %"


@dataclass(frozen=True)
class Row:
    """One rank's (or one host's, all its ranks together) figures in one group."""

    host: str
    ranks: tuple[int, ...]  # the rank; or the host's ranks in the group
    local_rank: int | None  # None for a host's row
    gpu: int | None
    last: float  # share of the collectives it arrived last at
    lag_median: float  # seconds behind the group's first arrival (a host: its first rank's)
    lag_p90: float
    waited: float  # share of the others' time spent waiting for it


@dataclass(frozen=True)
class GroupTable:
    """One process group's collectives, lined up across its members."""

    name: str
    desc: str
    members: int
    collectives: int  # lined up (every member recorded it) and analysed
    basis: str  # "gpu": NCCL's duration_ms; "cpu": time_created_ns
    seconds: float  # from the first arrival at the first to the last at the last
    through: int  # the newest sequence number analysed: `after` for the next analysis
    ranks: tuple[Row, ...] = ()
    hosts: tuple[Row, ...] = ()  # only where the group spans hosts
    missing: tuple[int, ...] = ()  # members with no summary: nothing can be lined up


@dataclass(frozen=True)
class Table:
    """Every group's figures: stragglers.json, `container-entry stragglers`."""

    groups: tuple[GroupTable, ...] = ()

    def through(self) -> dict[str, int]:
        return {g.name: g.through for g in self.groups}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Table:
        def rows(items: Iterable[Mapping[str, Any]]) -> tuple[Row, ...]:
            return tuple(Row(**{**r, "ranks": tuple(r["ranks"])}) for r in items)

        return cls(
            tuple(
                GroupTable(
                    **{
                        **g,
                        "ranks": rows(g["ranks"]),
                        "hosts": rows(g["hosts"]),
                        "missing": tuple(g["missing"]),
                    }
                )
                for g in data["groups"]
            )
        )


def analyse(
    arrivals: Sequence[RankArrivals],
    *,
    min_collectives: int = MIN_COLLECTIVES,
    after: Mapping[str, int] | None = None,
) -> Table:
    """Every group's collectives after `after[group]` that each of its members recorded, lined
    up; per rank (and per host) who came last, how late, and what it cost the others. A group
    with fewer than `min_collectives` such collectives gets no rows (its `through` stays)."""
    ranks = {a.rank: a for a in arrivals}
    names = sorted({g.name for a in arrivals for g in a.groups}, key=lambda n: (n != "0", n))
    return Table(
        tuple(_group(ranks, name, (after or {}).get(name, 0), min_collectives) for name in names)
    )


def _group(
    ranks: Mapping[int, RankArrivals], name: str, after: int, min_collectives: int
) -> GroupTable:
    own = {r: g for r, a in ranks.items() for g in a.groups if g.name == name}
    desc = next((g.desc for g in own.values() if g.desc), "")
    members = sorted({m for g in own.values() for m in g.ranks} or own)
    missing = tuple(m for m in members if m not in own)
    empty = GroupTable(name, desc, len(members), 0, "cpu", 0.0, after, missing=missing)
    if missing or len(members) < 2:
        return empty
    columns = {r: own[r].entries(after) for r in members}
    common = sorted(set.intersection(*(set(c) for c in columns.values())))
    timed = [s for s in common if all(columns[r][s][1] is not None for r in members)]
    basis, seqs = ("gpu", timed) if timed else ("cpu", common)
    if len(seqs) < min_collectives:
        return replace(empty, collectives=len(seqs))
    if basis == "gpu":  # who ran its kernel shortest reached it last
        lags = [_behind({r: -(columns[r][s][1] or 0.0) for r in members}) for s in seqs]
    else:
        lags = [_behind({r: columns[r][s][0] for r in members}) for s in seqs]
    start = min(columns[r][seqs[0]][0] for r in members)
    seconds = max(max(columns[r][seqs[-1]][0] for r in members) - start, 1e-9)
    # waiting per second of the window, the collectives not lined up (gaps) counted as the rest
    per_second = (seqs[-1] - seqs[0] + 1) / len(seqs) / seconds
    hosts = {r: ranks[r].host for r in members}
    return GroupTable(
        name,
        desc,
        len(members),
        len(seqs),
        basis,
        seconds,
        seqs[-1],
        _rank_rows(ranks, lags, per_second),
        _host_rows(hosts, lags, per_second),
    )


def _behind(arrived: Mapping[int, float]) -> dict[int, float]:
    first = min(arrived.values())
    return {r: t - first for r, t in arrived.items()}


def _last(lags: Mapping[Any, float]) -> Any:
    """Who arrived last; None on a tie (no one is blamed for an even finish)."""
    who, top, second = None, -math.inf, -math.inf
    for key, lag in lags.items():
        if lag > top:
            who, top, second = key, lag, top
        elif lag > second:
            second = lag
    return who if top > second else None


def _rank_rows(
    ranks: Mapping[int, RankArrivals], lags: list[dict[int, float]], scale: float
) -> tuple[Row, ...]:
    members = list(lags[0])
    last = dict.fromkeys(members, 0)
    waits = dict.fromkeys(members, 0.0)
    for lag in lags:
        if (who := _last(lag)) is not None:
            last[who] += 1
            waits[who] += sum(lag[who] - lag[r] for r in members if r != who)
    rows = []
    for r in members:
        own = [lag[r] for lag in lags]
        rank = ranks[r]
        rows.append(
            Row(
                rank.host,
                (r,),
                rank.local_rank,
                rank.gpu,
                last[r] / len(lags),
                statistics.median(own),
                _p90(own),
                min(1.0, waits[r] * scale / (len(members) - 1)),
            )
        )
    return tuple(rows)


def _host_rows(
    hosts: Mapping[int, str], lags: list[dict[int, float]], scale: float
) -> tuple[Row, ...]:
    """Per host with several members: is it late as a whole (its first rank after everyone
    elsewhere)? A host of one member is that rank's row."""
    on: dict[str, list[int]] = {}
    for rank, host in hosts.items():
        on.setdefault(host, []).append(rank)
    if len(on) < 2:
        return ()
    last = dict.fromkeys(on, 0)
    waits = dict.fromkeys(on, 0.0)
    firsts: dict[str, list[float]] = {h: [] for h in on}
    for lag in lags:
        first = {h: min(lag[r] for r in rs) for h, rs in on.items()}
        for h, value in first.items():
            firsts[h].append(value)
        if (who := _last(first)) is not None:
            last[who] += 1
            waits[who] += sum(max(0.0, first[who] - lag[r]) for r in hosts if hosts[r] != who)
    return tuple(
        Row(
            h,
            tuple(sorted(rs)),
            None,
            None,
            last[h] / len(lags),
            statistics.median(firsts[h]),
            _p90(firsts[h]),
            min(1.0, waits[h] * scale / (len(hosts) - len(rs))),
        )
        for h, rs in sorted(on.items())
        if len(rs) > 1
    )


def _p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def _consistent(row: Row, last_share: float, min_lag: float, min_wait: float) -> bool:
    return row.last >= last_share and row.lag_median >= min_lag and row.waited >= min_wait


def named(
    table: Table,
    *,
    last_share: float = LAST_SHARE,
    min_lag: float = MIN_LAG,
    min_wait: float = MIN_WAIT,
) -> list[tuple[GroupTable, Row]]:
    """Per group with a consistent straggler, that group and its row (a host whose ranks are
    all late together before a single rank of it); none for a balanced job."""
    found = []
    for group in table.groups:
        hosts = [h for h in group.hosts if _consistent(h, last_share, min_lag, min_wait)]
        ranks = [r for r in group.ranks if _consistent(r, last_share, min_lag, min_wait)]
        for rows in (hosts, ranks):
            if rows:
                found.append((group, max(rows, key=lambda r: r.waited)))
                break
    return found


def verdict(table: Table, **thresholds: float) -> list[str]:
    """One line per group with a consistent straggler (`named`); none for a balanced job."""
    return [straggler_line(group, row) for group, row in named(table, **thresholds)]


def who(row: Row) -> tuple[str, tuple[int, ...], int | None]:
    """Whom a row is about, whatever its figures: a straggler line is said again only when
    this changes."""
    return row.host, row.ranks, row.local_rank


def straggler_line(group: GroupTable, row: Row) -> str:
    where = f"{group_name(group.name, group.desc)}'s collectives"
    late = f"{_ms(row.lag_median)} after the first rank"
    share = f"last on {row.last:.0%} of {group.collectives} collectives"
    if row.local_rank is None:
        return (
            f"straggler: host {row.host} ({ranges(row.ranks)}, all late together) entered "
            f"{where} {late} (median of its first rank; p90 {_ms(row.lag_p90)}), {share}; the "
            f"ranks on other hosts spent {row.waited:.0%} of their time waiting for it"
        )
    gpu = "" if row.gpu is None else f", GPU {row.gpu}"
    return (
        f"straggler: rank {row.ranks[0]} (local {row.local_rank}{gpu}) on {row.host} entered "
        f"{where} {late} (median; p90 {_ms(row.lag_p90)}), {share}; the other ranks spent "
        f"{row.waited:.0%} of their time waiting for it"
    )


def _ms(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 10 else f"{seconds * 1e3:.0f} ms"


def cost(table: Table) -> float:
    """The share of the others' time lost to the worst straggler of any group (0 when none)."""
    return max((r.waited for g in table.groups for r in (*g.ranks, *g.hosts)), default=0.0)


def shown(table: Table) -> list[str]:
    """The table as `container-entry stragglers` prints it: per group, every rank and host row,
    the most waited-for first."""
    out = []
    for group in table.groups:
        out.append(
            f"{group_name(group.name, group.desc)}: {group.members} ranks, "
            f"{group.collectives} collectives lined up over {group.seconds:.1f} s "
            f"(entry times from the {'GPU' if group.basis == 'gpu' else 'CPU'})"
        )
        if group.missing:
            out.append(f"  no records from rank(s) {ranges(group.missing)}")
        for row in sorted((*group.hosts, *group.ranks), key=lambda r: -r.waited):
            who = (
                f"host {row.host} ({ranges(row.ranks)})"
                if row.local_rank is None
                else f"rank {row.ranks[0]} (local {row.local_rank}"
                + ("" if row.gpu is None else f", GPU {row.gpu}")
                + f") on {row.host}"
            )
            out.append(
                f"  {who}: last on {row.last:.0%}, behind the first {_ms(row.lag_median)} "
                f"(p90 {_ms(row.lag_p90)}), the others waited {row.waited:.0%} of their time"
            )
    return out
