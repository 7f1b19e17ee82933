"""The master's side of the straggler watch (supervise/straggler_watch.py) on the summaries
hosts send: a line when the straggler appears or changes and none while it stays, `none any
more` when it recovers, the table in stragglers.json, a restart's groups counted anew, the
end-of-job summary; and when the detection is off. The sampling itself (dumps asked of real
ranks, the side channel) runs in tests/integration/test_stragglers.py."""

from __future__ import annotations

import json

from container_entry.common.layout import ControlDir, RunDir
from container_entry.supervise.straggler_watch import StragglerWatch, next_moment, off_because
from tests.unit.test_stragglers import STEP, T0, hosts_of, rank_dump, record, summarize


def summaries(slow: int | None, seqs: range, world: int = 4, lag: float = 0.2):
    found = []
    for rank, (host, local) in hosts_of(world, 2).items():
        late = lag if rank == slow else 0.0
        records = [record(s, T0 + s * STEP + late + 0.001 * (s % 3 == rank % 3)) for s in seqs]
        found.append(summarize(rank, local, host, rank_dump(records, world), None, limit=200))
    return found


def watch(tmp_path) -> StragglerWatch:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    # conclude() never touches the side channel: no session is needed for it
    return StragglerWatch(60.0, "algo-1", False, ControlDir(tmp_path), run, session=None)  # type: ignore[arg-type]


def said(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "straggler" in line]


def test_a_line_when_the_straggler_appears_or_changes_and_none_while_it_stays(tmp_path, capsys):
    master = watch(tmp_path)
    master.conclude(summaries(3, range(1, 41)))
    (line,) = said(capsys)
    assert "straggler: rank 3 (local 1) on algo-2 entered the default group's" in line, line
    master.conclude(summaries(3, range(41, 81), lag=0.3))
    assert said(capsys) == []  # the same straggler, later still: nothing new to say
    assert "300 ms after the first rank" in master.named["0"]  # its figures kept up to date
    master.conclude(summaries(3, range(81, 90)))  # too few new collectives: nothing yet
    assert said(capsys) == [] and master.through["0"] == 80
    master.conclude(summaries(1, range(90, 130)))
    (moved,) = said(capsys)
    assert "straggler: rank 1 (local 1) on algo-1" in moved, moved
    table = json.loads(master.run_dir.stragglers.read_text())
    assert table["lines"] == [moved.removeprefix("[container-entry] ")]
    rows = {r["ranks"][0]: r for r in table["groups"][0]["ranks"]}
    assert rows[1]["last"] > 0.8 and rows[3]["last"] < 0.2  # 81-89 held: rank 3 last there
    master.conclude(summaries(None, range(130, 170)))
    assert said(capsys) == ["[container-entry] straggler: none any more in group 0"]
    master.finish()
    assert said(capsys) == []  # balanced at the end: no summary


def test_a_restart_counts_its_groups_anew_and_the_end_names_the_straggler(tmp_path, capsys):
    master = watch(tmp_path)
    master.conclude(summaries(None, range(1, 201)))
    assert said(capsys) == [] and master.through["0"] == 200
    master.conclude(summaries(2, range(1, 41)))  # the workers restarted: seq 1 again
    (line,) = said(capsys)
    assert "straggler: rank 2 (local 0) on algo-2" in line, line
    master.finish()
    (summary,) = said(capsys)
    assert summary.startswith("[container-entry] straggler summary: rank 2 (local 0) on algo-2")


def test_off_for_a_flight_recorder_turned_off_and_the_moments_are_the_clocks():
    assert off_because({"TORCH_FR_BUFFER_SIZE": "2000"}) is None
    assert off_because({"TORCH_FR_BUFFER_SIZE": None}) is None
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        assert off_because({name: " 0"}) == f"{name}=0 (the ranks record no collectives)"
    assert next_moment(1000.0, 180.0) == 1080.0 and next_moment(1080.0, 180.0) == 1260.0
    assert next_moment(1079.9, 180.0) == 1080.0


def test_a_host_of_many_ranks_sends_one_line_the_master_accepts():
    """Each rank cut to its share, the ones that say nothing left out, and never a line over
    the side channel's limit (a longer one would be the host's misbehaviour at the master)."""
    from container_entry.hosts.wire import LINE_LIMIT, MessageKind, encode
    from container_entry.supervise.straggler_watch import ENVELOPE, _fitted

    records = [record(s, T0 + s * STEP) for s in range(1, 65)]
    for ranks in (8, 96, 1000):
        budget = (LINE_LIMIT - ENVELOPE) // ranks
        found = [
            summarize(r, r % 8, "algo-1", rank_dump(records, ranks), None, budget=budget)
            for r in range(ranks)
        ]
        sent = _fitted(found)
        line = encode({"type": MessageKind.ARRIVALS, "ranks": [s.to_json() for s in sent]})
        assert len(line) <= LINE_LIMIT and all(s.groups for s in sent), ranks
        # 1000 ranks on a host: 64 bytes each hold no collective, so that host sends nothing
        assert len(sent) == (ranks if ranks <= 96 else 0), (ranks, len(sent))
