"""Naming a hang's culprit from flight-recorder records (container_entry.diagnose.culprit), on
records shaped as torch 2.9 and 2.15 write them (`_dump_fr_trace_json`, `_dump_nccl_trace_json`)."""

from __future__ import annotations

import calendar
import json
import os
import time

import pytest

from container_entry.diagnose.culprit import RankCalls, analyse, calls_of, groups_of, ranges

T0 = calendar.timegm((2026, 12, 4, 14, 2, 11, 0, 0, 0))


def entry(
    seq,
    op="all_reduce",
    done=True,
    group=("0", "default_pg"),
    sizes=((4096,),),
    dtypes=("Float",),
    backend="nccl",
):
    return {
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "is_p2p": False,
        "op_id": seq,
        "pg_id": 0,
        "process_group": list(group),
        "profiling_name": f"{backend}:{op}",
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": list(dtypes),
        "output_sizes": [list(s) for s in sizes],
        "output_dtypes": list(dtypes),
        "retired": done,
        "state": "completed" if done else "started",
        "time_created_ns": int((T0 + seq) * 1e9),
    }


def dump(entries, world=4, recorder="nccl"):
    return {
        "pid": 1,
        "recorders": {
            recorder: {
                "entries": entries,
                "pg_config": {
                    "0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}
                },
            }
        },
        "errors": {},
    }


def rank(number, host, entries, where=None, world=4, recorder="nccl"):
    data = dump(entries, world, recorder)
    return RankCalls(number, host, calls_of(data), groups_of(data), where)


def test_a_rank_that_never_entered_the_collective_the_others_wait_in_is_named():
    done = [entry(s) for s in range(1, 6)]
    ranks = [
        rank(0, "algo-1", [*done, entry(6, done=False)]),
        rank(1, "algo-1", [*done, entry(6, done=False)]),
        rank(2, "algo-2", [*done, entry(6, done=False)]),
        rank(3, "algo-2", done, where="train.py:88 in evaluate"),
    ]
    assert analyse(ranks) == (
        "rank 3 on algo-2 never entered all_reduce #6 of the default group; the 3 other ranks "
        "wait in it since 14:02:17 UTC; rank 3 was at train.py:88 in evaluate"
    )


@pytest.mark.parametrize("recorder", ["nccl", "generic"])
def test_several_culprits_on_several_hosts_and_gloo_records(recorder):
    backend = "gloo" if recorder == "generic" else "nccl"
    done = [entry(s, backend=backend) for s in range(1, 3)]
    waiting = [*done, entry(3, done=False, backend=backend)]
    ranks = [
        rank(0, "algo-1", waiting, recorder=recorder, world=6),
        rank(1, "algo-1", done[:1], recorder=recorder, world=6),
        rank(2, "algo-2", waiting, recorder=recorder, world=6),
        rank(3, "algo-2", done, recorder=recorder, world=6),
        rank(4, "algo-3", [], recorder=recorder, world=6),  # never recorded anything
        rank(5, "algo-3", waiting, recorder=recorder, world=6),
    ]
    verdict = analyse(ranks)
    assert verdict.startswith(
        "rank 1 on algo-1 and rank 3 on algo-2 and rank 4 on algo-3 never entered all_reduce #3"
    ), verdict
    assert "the 3 other ranks wait in it" in verdict


def test_ranks_calling_different_collectives_are_a_desync():
    done = [entry(s) for s in range(1, 57)]
    ranks = [
        rank(r, "algo-1" if r < 2 else "algo-2", [*done, entry(57, done=False)]) for r in range(3)
    ]
    ranks.append(
        rank(
            3,
            "algo-2",
            [*done, entry(57, op="broadcast", done=False, sizes=((1,),), dtypes=("Long",))],
        )
    )
    assert analyse(ranks) == (
        "ranks disagree at collective #57: ranks 0-2 in all_reduce([4096] float32), "
        "rank 3 in broadcast([1] int64)"
    )


def test_every_rank_waiting_in_the_same_collective_blames_none_of_them():
    ranks = [rank(r, "algo-1", [entry(1), entry(2, done=False)], world=2) for r in range(2)]
    verdict = analyse(ranks)
    assert verdict.startswith("every rank of the default group waits in all_reduce #2 since")
    assert "none is missing" in verdict


def test_no_pending_collective_is_no_verdict():
    ranks = [rank(r, "algo-1", [entry(1), entry(2)], world=2) for r in range(2)]
    assert analyse(ranks) is None
    assert analyse([]) is None


def test_a_named_subgroup_is_named():
    group = ("3", "tensor_parallel")
    ranks = [
        rank(0, "algo-1", [entry(1, group=group), entry(2, group=group, done=False)], world=2),
        rank(1, "algo-1", [entry(1, group=group)], world=2),
    ]
    for r in ranks:
        r.groups["3"] = ("tensor_parallel", (0, 1))
    verdict = analyse(ranks)
    assert verdict.startswith(
        "rank 1 on algo-1 never entered all_reduce #2 of group tensor_parallel"
    )


@pytest.mark.parametrize(
    "bad",
    [None, "x", {}, {"collective_seq_id": "x"}, {"collective_seq_id": 1, "input_sizes": "no"}],
)
def test_malformed_records_are_skipped_not_fatal(bad):
    data = dump([bad, entry(1, done=False)])
    assert [c.seq for c in calls_of(data)] == [1]
    assert calls_of({"recorders": "x"}) == [] and groups_of({}) == {}


def test_only_the_tail_of_each_group_is_kept():
    data = dump([entry(s) for s in range(1, 501)])
    assert [c.seq for c in calls_of(data, limit=5)] == [496, 497, 498, 499, 500]


def test_rank_ranges_read_as_people_write_them():
    assert ranges([3]) == "rank 3"
    assert ranges([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"
    assert time.gmtime(T0).tm_hour == 14


def _write_run(tmp_path, dumps):
    from container_entry.common.layout import RunDir

    run = RunDir(tmp_path / "run")
    run.dumps.mkdir(parents=True)
    for name, data in dumps.items():
        (run.dumps / name).write_text(json.dumps(data))
    return run


def test_a_rank_that_died_of_a_timeout_waited_in_its_last_collective(tmp_path):
    """gloo marks the call that timed out as retired; the rank's dump at its death still says
    where it waited: rank 1, whose live dump stops at #3, is named."""
    from container_entry.diagnose.culprit import local_ranks

    retired = [entry(seq, backend="gloo") for seq in (1, 2, 3, 4)]
    run = _write_run(
        tmp_path,
        {
            "exit-rank-0.json": dump(retired, world=2, recorder="generic"),
            "rank-1.json": dump(retired[:3], world=2, recorder="generic"),
        },
    )
    found = analyse(local_ranks(run, "algo-1"))
    assert found is not None
    assert found.startswith("rank 1 on algo-1 never entered all_reduce #4 of the default group")


def test_nccl_s_own_timeout_dump_is_read_as_plain_data_and_nothing_else(tmp_path):
    """NCCL writes a pickle at its watchdog's timeout (`nccl_trace_rank_<N>`): read without
    loading any class, so a file that names one gives no records instead of running code."""
    import pickle

    from container_entry.diagnose.culprit import local_ranks

    run = _write_run(tmp_path, {"rank-1.json": dump([entry(1), entry(2)], world=2)})
    nccl = dump([entry(1), entry(2), entry(3, done=False)], world=2)["recorders"]["nccl"]
    (run.path / "nccl_trace_rank_0").write_bytes(pickle.dumps(nccl))
    found = analyse(local_ranks(run, "algo-1"))
    assert found and found.startswith("rank 1 on algo-1 never entered all_reduce #3")

    class Planted:
        def __reduce__(self):
            return (os.system, ("touch planted",))

    (run.path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"entries": [Planted()]}))
    (run.path / "nccl_trace_rank_2").write_bytes(b"\x80\x04torn")
    ranks = {r.rank: r for r in local_ranks(run, "algo-1")}
    assert set(ranks) == {1} and not (tmp_path / "planted").exists()


def test_only_the_newest_life_of_a_group_made_twice_counts():
    """The preflight's process group ran 34 collectives under the name "0" in the same process
    before the script's made its own "0" and counted from 1 again (torch's records keep both):
    the culprit is in the script's group, not the preflight's long-finished barrier #34."""

    def lives(script_calls, waiting):
        ops = ["all_reduce"] * 33 + ["barrier"]
        preflight = [entry(seq, op=op) for seq, op in enumerate(ops, start=1)]
        script = [entry(seq) for seq in range(1, script_calls + 1)]
        if waiting:
            script[-1] = {**script[-1], "retired": False, "state": "started"}
        return [{**e, "record_id": i} for i, e in enumerate(preflight + script)]

    ranks = [rank(r, "algo-1", lives(5, waiting=True), world=4) for r in (0, 1, 2)]
    ranks.append(rank(3, "algo-2", lives(4, waiting=False), world=4))
    found = analyse(ranks)
    assert found is not None
    assert found.startswith("rank 3 on algo-2 never entered all_reduce #5 of the default group"), (
        found
    )
