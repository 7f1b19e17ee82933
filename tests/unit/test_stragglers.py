"""The slowest rank named from the ranks' collective records (container_entry.diagnose.stragglers
and arrivals): on records shaped as torch writes them (the fixtures of test_culprit.py), and on
a real two-rank gloo job's own flight recorder."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest

from container_entry.diagnose.stragglers import (
    LIMIT,
    RANK_BUDGET,
    RankArrivals,
    Table,
    analyse,
    cost,
    encoded,
    merge,
    shift,
    summarize,
    verdict,
)
from tests.ports import job_port
from tests.unit.test_culprit import T0, dump, entry

DEFAULT = ("0", "default_pg")
STEP = 0.5  # seconds between collectives
SIDE_CHANNEL_LINE = 64 * 1024  # container_entry/hosts/wire.py LINE_LIMIT


def record(seq, seconds, group=DEFAULT, duration=None, done=True, backend="nccl"):
    """One collective as torch records it, entered at `seconds` (epoch) by this rank's clock."""
    found = {**entry(seq, group=group, done=done, backend=backend)}
    found["time_created_ns"] = int(seconds * 1e9)
    if duration is not None:
        found["duration_ms"] = duration * 1e3
    return found


def rank_dump(records, world=4, groups=()):
    """A rank's dump, with the process groups `groups` (name, desc, ranks) in its pg_config."""
    data = dump(records, world)
    config = data["recorders"]["nccl"]["pg_config"]
    for name, desc, ranks in groups:
        config[name] = {"name": name, "desc": desc, "ranks": str(list(ranks))}
    return data


def hosts_of(world, per_host):
    return {r: (f"algo-{r // per_host + 1}", r % per_host) for r in range(world)}


def job(lags, seqs=range(1, 101), world=4, per_host=2, group=DEFAULT, offsets=None, seed=0):
    """Every rank's summary of a job whose rank r enters collective s `lags(r, s)` seconds
    after its start (on the true clock); a host's clock `offsets[host]` ahead of the truth."""
    jitter = random.Random(seed)
    found = []
    for rank, (host, local) in hosts_of(world, per_host).items():
        ahead = (offsets or {}).get(host, 0.0)
        records = [
            record(s, T0 + s * STEP + lags(rank, s) + jitter.uniform(0, 0.005) + ahead, group)
            for s in seqs
        ]
        data = rank_dump(records, world)
        found.append(summarize(rank, local, host, data, None, limit=len(seqs), gpu=local))
    return found


def test_balanced_ranks_with_jitter_print_nothing():
    table = analyse(job(lambda r, s: 0.0, world=8, per_host=4), min_collectives=20)
    (group,) = table.groups
    assert group.collectives == 100 and group.basis == "cpu" and group.members == 8
    assert verdict(table) == []
    assert cost(table) < 0.03
    assert max(r.last for r in group.ranks) < 0.5


def test_a_rank_late_on_every_collective_is_named_with_its_figures():
    """Rank 3 enters 150-250 ms after the others: median 200 ms, p90 240 ms (nearest rank)."""
    seqs = range(1, 102)
    lags = {s: 0.150 + 0.001 * (s - 1) for s in seqs}

    def late(rank, seq):
        return lags[seq] if rank == 3 else 0.0

    rows = []
    for rank, (host, local) in hosts_of(4, 2).items():
        times = [T0 + s * STEP + late(rank, s) for s in seqs]
        data = rank_dump([record(s, t) for s, t in zip(seqs, times, strict=True)])
        rows.append(summarize(rank, local, host, data, None, limit=200, gpu=local))
    table = analyse(rows, min_collectives=20)
    assert verdict(table) == [
        "straggler: rank 3 (local 1, GPU 1) on algo-2 entered the default group's collectives "
        "200 ms after the first rank (median; p90 240 ms), last on 100% of 101 collectives; "
        "the other ranks spent 40% of their time waiting for it"
    ]
    row = next(r for r in table.groups[0].ranks if r.ranks == (3,))
    assert row.lag_median == pytest.approx(0.200, abs=1e-5)
    assert row.lag_p90 == pytest.approx(0.240, abs=1e-5)
    assert cost(table) == pytest.approx(row.waited) and 0.35 < row.waited < 0.45


def test_a_jittery_rank_200_ms_late_among_jittery_ranks_is_named():
    table = analyse(job(lambda r, s: 0.2 if r == 2 else 0.0), min_collectives=20)
    (line,) = verdict(table)
    assert line.startswith("straggler: rank 2 (local 0, GPU 0) on algo-2 entered the default")
    row = next(r for r in table.groups[0].ranks if r.ranks == (2,))
    assert 0.195 < row.lag_median < 0.206 and row.last == 1.0


def test_the_name_follows_the_slowness_from_one_window_to_the_next():
    """Rank 1 is slow in the first interval, rank 2 in the second: each host sends only what
    is new (since_seq), the master merges and analyses each collective once (`after`)."""
    world, hosts = 4, hosts_of(4, 2)

    def entered(rank, seq):
        slow = 1 if seq <= 50 else 2
        return T0 + seq * STEP + (0.2 if rank == slow else 0.001 * rank)

    held: dict[int, RankArrivals] = {}
    since: dict[int, dict[str, int]] = {}
    after: dict[str, int] = {}
    lines = []
    for last_seq in (50, 100):
        for rank, (host, local) in hosts.items():
            data = rank_dump([record(s, entered(rank, s)) for s in range(1, last_seq + 1)], world)
            new = summarize(rank, local, host, data, since.get(rank), limit=LIMIT, gpu=local)
            assert new.groups[0].seqs[0] == last_seq - 49  # only what was not sent before
            since[rank] = new.newest()
            held[rank] = merge(held.get(rank), shift(new, 0.0))
        table = analyse(list(held.values()), min_collectives=20, after=after)
        after = table.through()
        lines += verdict(table)
    assert [line.split(" on ")[0] for line in lines] == [
        "straggler: rank 1 (local 1, GPU 1)",
        "straggler: rank 2 (local 0, GPU 0)",
    ]
    assert after == {"0": 100}


def test_a_host_whose_ranks_are_all_late_together_is_named():
    """Host algo-2's four ranks each enter about 150 ms late; which of them is last varies."""
    table = analyse(job(lambda r, s: 0.15 if r >= 4 else 0.0, world=8, per_host=4))
    (line,) = verdict(table)
    assert line.startswith(
        "straggler: host algo-2 (ranks 4-7, all late together) entered the default group's "
        "collectives 15"
    ), line
    assert "the ranks on other hosts spent" in line
    (group,) = table.groups
    assert {h.host for h in group.hosts} == {"algo-1", "algo-2"}
    assert max(r.last for r in group.ranks) < 0.75  # no single rank of it is consistently last


def test_each_process_group_is_reported_on_its_own():
    """World 4: data-parallel groups {0, 2} and {1, 3}, tensor-parallel {0, 1} and {2, 3}.
    Rank 2 is late in its data-parallel group, rank 3 in its tensor-parallel one."""
    layout = [
        ("1", "data_parallel", (0, 2)),
        ("2", "data_parallel", (1, 3)),
        ("3", "tensor_parallel", (0, 1)),
        ("4", "tensor_parallel", (2, 3)),
    ]
    late = {("1", 2): 0.2, ("4", 3): 0.12}
    jitter = random.Random(1)
    rows = []
    for rank, (host, local) in hosts_of(4, 2).items():
        mine = [g for g in layout if rank in g[2]]
        records = []
        for name, desc, _ in mine:
            for s in range(1, 61):
                lag = late.get((name, rank), 0.0) + jitter.uniform(0, 0.004)
                records.append(record(s, T0 + s * STEP + lag, (name, desc)))
        data = rank_dump([*records, record(1, T0, DEFAULT)], groups=mine)
        rows.append(summarize(rank, local, host, data, None))
    table = analyse(rows, min_collectives=20)
    assert [(g.name, g.members, g.collectives) for g in table.groups] == [
        ("0", 4, 1),
        ("1", 2, 60),
        ("2", 2, 60),
        ("3", 2, 60),
        ("4", 2, 60),
    ]
    assert table.groups[0].ranks == ()  # one collective is below min_collectives: no rows
    lines = verdict(table)
    assert [line.split(" entered ")[1].split(" after")[0] for line in lines] == [
        "group data_parallel's collectives 200 ms",
        "group tensor_parallel's collectives 120 ms",
    ], lines
    assert lines[0].startswith("straggler: rank 2") and lines[1].startswith("straggler: rank 3")


def test_a_host_clock_two_seconds_ahead_is_corrected_by_its_offset():
    offsets = {"algo-2": 2.0}  # algo-2's clock reads 2 s more than the master's
    raw = job(lambda r, s: 0.0, offsets=offsets)
    assert verdict(analyse(raw))  # uncorrected, algo-2 looks 2 s late
    skew = {"algo-1": 0.0, "algo-2": -2.0}  # the side channel's: master's clock less the host's
    corrected = [shift(a, skew[a.host]) for a in raw]
    assert verdict(analyse(corrected)) == []
    assert max(r.lag_median for r in analyse(corrected).groups[0].ranks) < 0.006


def test_since_seq_sends_only_what_is_new_and_what_has_completed():
    first = [record(s, T0 + s) for s in range(1, 11)]
    running = record(11, T0 + 11, done=False)
    one = summarize(0, 0, "algo-1", dump([*first, running]), None)
    assert one.groups[0].seqs == tuple(range(1, 11))  # #11 is sent once it has completed
    two = summarize(0, 0, "algo-1", dump([*first, record(11, T0 + 11)]), one.newest())
    assert two.groups[0].seqs == (11,)
    assert summarize(0, 0, "algo-1", dump(first), {"0": 10}).groups == ()
    # the group made anew (the script's after the preflight's): counted from 1 again
    lives = [{**r, "record_id": i} for i, r in enumerate([*first, *first[:3]])]
    again = summarize(0, 0, "algo-1", dump(lives), {"0": 10})
    assert again.groups[0].seqs == (1, 2, 3)
    assert summarize(0, 0, "algo-1", dump(first), None, limit=4).groups[0].seqs == (7, 8, 9, 10)


def test_nccl_durations_name_the_rank_whose_gpu_came_last_whatever_the_host_clocks():
    """TORCH_NCCL_ENABLE_TIMING: every kernel ends together, so the member whose kernel ran
    shortest arrived last (by the GPU); the CPU-side entry times (all alike here, the CPUs run
    ahead) are not what is read."""
    rows = []
    for rank, (host, local) in hosts_of(4, 2).items():
        records = [
            record(s, T0 + s * STEP, duration=0.010 if rank == 1 else 0.110) for s in range(1, 41)
        ]
        rows.append(summarize(rank, local, host, rank_dump(records), None, gpu=local))
    table = analyse(rows)
    (group,) = table.groups
    assert group.basis == "gpu"
    (line,) = verdict(table)
    assert line.startswith("straggler: rank 1 (local 1, GPU 1) on algo-1 entered the default "
                           "group's collectives 100 ms after")  # fmt: skip
    # one member without durations (timing off in that process): the CPU's entry times
    rows[0] = summarize(
        0, 0, "algo-1", rank_dump([record(s, T0 + s * STEP) for s in range(1, 41)]), None
    )
    assert analyse(rows).groups[0].basis == "cpu"


def test_summaries_and_tables_survive_json():
    rows = job(lambda r, s: 0.2 if r == 3 else 0.0)
    again = [RankArrivals.from_json(json.loads(encoded(a))) for a in rows]
    assert [a.groups[0].seqs for a in again] == [a.groups[0].seqs for a in rows]
    for new, old in zip(again, rows, strict=True):
        assert new.groups[0].entered == pytest.approx(old.groups[0].entered, abs=1e-6)
        assert new.groups[0].ranks == (0, 1, 2, 3) and new.gpu == old.gpu
    table = analyse(again)
    assert Table.from_json(json.loads(json.dumps(table.to_json()))) == table
    sent = json.loads(encoded(rows[0]))
    for broken in (
        {"rank": 1, "groups": [{"seq": "x"}]},
        {**sent, "groups": [{**sent["groups"][0], "seq": [5, -1, *sent["groups"][0]["seq"][2:]]}]},
        {**sent, "groups": [{**sent["groups"][0], "ranks": [[0, 10**9, 1]]}]},
        {**sent, "groups": [{**sent["groups"][0], "us": [1]}]},
    ):
        with pytest.raises(ValueError):
            RankArrivals.from_json(broken)


def test_the_master_keeps_what_each_rank_sent_until_every_member_has_reported_it():
    def sent(seqs, group=DEFAULT):
        data = dump([record(s, T0 + s, group) for s in seqs])
        return summarize(0, 0, "algo-1", data, None, limit=1000)

    held = merge(None, sent(range(1, 11)))
    held = merge(held, sent(range(11, 16)))
    assert held.groups[0].seqs == tuple(range(1, 16))
    assert merge(held, sent(range(11, 16)), keep=4).groups[0].seqs == (12, 13, 14, 15)
    tp = ("5", "tensor_parallel")
    both = merge(held, sent(range(1, 3), tp))  # a group this interval did not send is kept
    assert [(g.name, g.seqs[-1]) for g in both.groups] == [("0", 15), ("5", 2)]
    anew = merge(held, sent(range(1, 4)))  # counted from 1 again: the group was made anew
    assert anew.groups[0].seqs == (1, 2, 3)


def worst_case_dump():
    """Twelve groups (more than are sent), sequence numbers and times far apart, durations."""
    rng = random.Random(7)
    records = []
    for g in range(12):
        seq, now = 10**9, T0 + 10**6
        for _ in range(LIMIT):
            seq += rng.randrange(1, 10**8)
            now += rng.uniform(1, 10**5)
            group = (f"{g}" * 12, "a_description_long_enough_" * 2)
            records.append(record(seq, now, group, duration=rng.uniform(0, 10**4)))
    return dump(records, world=2048)


def test_the_bytes_a_host_and_the_master_get_per_interval_are_bounded():
    """Typical: 8 ranks, 2 groups (world 2048, 8-way tensor parallel), LIMIT collectives each
    every ~50 ms, with NCCL durations. Worst: never over RANK_BUDGET a rank, whatever comes."""
    per_rank, per_collective = [], []
    for local in range(8):
        rank = 8 * 255 + local
        records = [
            record(s, T0 + s * 0.05 + 0.001 * local, group, duration=0.012)
            for group in (DEFAULT, ("7", "tensor_parallel"))
            for s in range(10_001, 10_001 + LIMIT)
        ]
        layout = [("7", "tensor_parallel", range(8 * 255, 8 * 256))]
        data = rank_dump(records, world=2048, groups=layout)
        size = len(encoded(summarize(rank, local, "algo-256", data, None, gpu=local)))
        alone = len(encoded(summarize(rank, local, "algo-256", data, None, 1, gpu=local)))
        per_rank.append(size)
        per_collective.append((size - alone) / (2 * (LIMIT - 1)))
    host = sum(per_rank)
    assert max(per_collective) <= 16, per_collective  # measured: 14 (8 without durations)
    assert max(per_rank) <= 2.5 * 1024, per_rank  # measured: 2044
    assert host <= 20 * 1024, host  # measured: 16 KiB a host
    assert 256 * host <= 5 * 1024 * 1024  # measured: 4 MiB at the master per interval
    worst = summarize(2047, 7, "algo-256", worst_case_dump(), None, gpu=7)
    assert len(encoded(worst)) <= RANK_BUDGET and len(worst.groups) <= 8
    assert 8 * RANK_BUDGET + 1024 <= SIDE_CHANNEL_LINE  # a host's line, with its envelope
    assert 256 * 8 * RANK_BUDGET <= 14 * 1024 * 1024  # the master's bound per interval


RANK_PROGRAM = """
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, t = dist.get_rank(), torch.ones(8)
for _ in range(int(sys.argv[2])):
    if rank == 1:
        time.sleep(0.2)
    dist.all_reduce(t)
raw = torch._C._distributed_c10d._dump_fr_trace_json()
with open(sys.argv[1] + f"/rank-{rank}.json", "w") as out:
    out.write(raw.decode() if isinstance(raw, bytes) else raw)
dist.destroy_process_group()
"""


def test_a_real_gloo_rank_sleeping_200_ms_before_each_collective_is_named(tmp_path):
    """Two processes, torch's own flight recorder (the generic one: gloo) dumped in-process as
    _site/sitecustomize.py does, then summarize and analyse."""
    pytest.importorskip("torch")
    count = 10
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(job_port()),
        "WORLD_SIZE": "2",
        "TORCH_FR_BUFFER_SIZE": "100",
    }
    program = textwrap.dedent(RANK_PROGRAM)
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", program, str(tmp_path), str(count)],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
        )
        for r in (0, 1)
    ]
    assert [p.wait(timeout=120) for p in ranks] == [0, 0]
    summaries = []
    for r in (0, 1):
        records = json.loads((tmp_path / f"rank-{r}.json").read_text())
        data = {"recorders": {"generic": records}}
        summaries.append(summarize(r, r, "algo-1", data, None))
    table = analyse(summaries, min_collectives=count - 2)
    (line,) = verdict(table)
    assert line.startswith("straggler: rank 1 (local 1) on algo-1 entered the default group's")
    row = next(r for r in table.groups[0].ranks if r.ranks == (1,))
    assert 0.15 < row.lag_median < 0.4 and row.waited > 0.5, row
