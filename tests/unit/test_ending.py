"""How a run ends (container_entry.supervise.ending), without processes: `ending_of`'s priority
order over every pair of endings one look can show, and the verdict each ending becomes."""

from __future__ import annotations

import itertools
import signal

import pytest

from container_entry.common.exits import ExitCode
from container_entry.common.layout import RunDir
from container_entry.common.records import RankRecord
from container_entry.common.stopping import StopSignal
from container_entry.diagnose.failure import hung_words
from container_entry.supervise.ending import (
    Ending,
    EndingKind,
    Observed,
    Seen,
    ending_of,
    stop_cut_a_script,
    verdict,
)


def record(**fields) -> RankRecord:
    return RankRecord(**{"host": "algo-1", "rank": 0, "local_rank": 0, **fields})


FAILURE = record(returncode=1, ended_at=5.0)
PEER = RankRecord(host="algo-2", rank=3, returncode=1)
HANG = RankRecord(host=None, rank=None, returncode=ExitCode.HUNG, what=hung_words(60, 2))
STOP_WORDS = "job stopped by SIGINT on algo-2 (StopTrainingJob, Spot interruption or docker stop)"
PEER_STOP = RankRecord(
    host="algo-2",
    rank=None,
    returncode=130,
    what=STOP_WORDS,
    stop=StopSignal("SIGINT", 50.0),
    failed_at=50.0,
)
# what one look can show, each alone: the fields of Seen that make each ending
SHOWS = {
    EndingKind.STOPPED: {"stop": StopSignal("SIGTERM", 1.0)},
    EndingKind.FAILED: {"failures": (FAILURE,)},
    EndingKind.LOST_MASTER: {"lost_master": "algo-1"},
    EndingKind.HUNG: {"idle": 61.0, "hang_timeout": 60.0},
    EndingKind.PEER_FAILED: {"relayed": PEER},
    EndingKind.PEER_STOPPED: {"relayed": PEER_STOP},
}
RELAYED = {
    EndingKind.HUNG,
    EndingKind.PEER_FAILED,
    EndingKind.PEER_STOPPED,
}  # the master's one word, or own hang


@pytest.mark.parametrize("kind", list(SHOWS))
def test_each_ending_alone(kind):
    assert ending_of(Seen(**SHOWS[kind])).kind is kind


# every pair but two of the master's words: its hang verdict, another host's failure and
# another host's stop each come as its one word (`relayed`), never together (tested below)
PAIRS = [pair for pair in itertools.combinations(SHOWS, 2) if not set(pair) <= RELAYED]


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_of_two_at_one_look_the_one_declared_first_wins(first, second):
    assert ending_of(Seen(**SHOWS[first], **SHOWS[second])).kind is first


def test_the_order_is_written_once_in_the_type():
    assert list(EndingKind)[:6] == list(SHOWS)


def test_the_master_s_word_is_a_hang_or_a_peer_s_failure_or_its_stop():
    assert ending_of(Seen(relayed=HANG)) == Ending(EndingKind.HUNG, HANG)
    assert ending_of(Seen(relayed=PEER)) == Ending(EndingKind.PEER_FAILED, PEER)
    assert ending_of(Seen(relayed=PEER_STOP)) == Ending(EndingKind.PEER_STOPPED, PEER_STOP)
    # a rank's record with a stop its wrapper saw is no host's stop
    ranks_stop = RankRecord(host="algo-2", rank=1, returncode=1, stop=StopSignal("SIGTERM", 9.0))
    assert ending_of(Seen(relayed=ranks_stop)).kind is EndingKind.PEER_FAILED


@pytest.mark.parametrize(("name", "code"), [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_another_host_s_stop_is_this_host_s_stop_naming_that_host(tmp_path, name, code):
    """This host's ranks got the other host's signal: the exit code is that stop's, the first
    line names the stopped host first and then says how this host's ranks ended."""
    came = StopSignal(name, 100.0)
    stop = RankRecord(host="algo-2", rank=None, returncode=code, what=STOP_WORDS, stop=came)
    ranks = {r: record(rank=r, local_rank=r, stop=came, ended_at=101.5) for r in (0, 1)}
    run = stopped_run(name, launched={0, 1}, results=ranks)
    result = verdict(Ending(EndingKind.PEER_STOPPED, stop), run, "algo-1", RunDir(tmp_path))
    assert result.exit_code == code
    assert result.reason == f"{STOP_WORDS}; on algo-1: all 2 local ranks exited within 1.5 s"
    # its word came before this host launched anything: that stop's code all the same
    before = verdict(Ending(EndingKind.PEER_STOPPED, stop), Observed(), "algo-1", RunDir(tmp_path))
    assert before.exit_code == code
    assert before.reason == f"{STOP_WORDS}; on algo-1: the stop came before any rank started"
    # every script here had ended before its word came: a finished job, as for a stop here
    done = {r: record(rank=r, script_ended_at=99.0, ended_at=99.5) for r in (0, 1)}
    run = stopped_run(name, launched={0, 1}, results=done)
    assert (
        verdict(Ending(EndingKind.PEER_STOPPED, stop), run, "algo-1", RunDir(tmp_path)).exit_code
        == 0
    )


def test_nothing_yet_while_torchrun_runs_then_how_it_exited():
    assert ending_of(Seen()) is None
    assert ending_of(Seen(exited=True, returncode=0)).kind is EndingKind.SUCCEEDED
    assert ending_of(Seen(exited=True, returncode=1)).kind is EndingKind.TORCHRUN_FAILED


def test_with_restarts_a_failure_waits_for_torchrun_unless_it_would_repeat():
    assert ending_of(Seen(failures=(FAILURE,), restarts=2)) is None
    assert ending_of(Seen(failures=(FAILURE,), restarts=2, exited=True)).kind is EndingKind.FAILED
    syntax = record(returncode=1, exception={"type": "SyntaxError", "message": "x"})
    assert ending_of(Seen(failures=(syntax,), restarts=2)).kind is EndingKind.FAILED


def test_the_first_of_several_local_failures_by_end_time():
    late, early = record(rank=1, returncode=1, ended_at=9.0), record(returncode=2, ended_at=3.0)
    assert ending_of(Seen(failures=(late, early))).record is early


def test_the_hang_of_one_host_names_it():
    ending = ending_of(Seen(idle=10.0, hang_timeout=5.0, host="algo-1"))
    assert ending.kind is EndingKind.HUNG and ending.record.what == hung_words(5.0)
    assert ending_of(Seen(idle=4.0, hang_timeout=5.0)) is None
    assert ending_of(Seen(idle=100.0, hang_timeout=0.0)) is None  # off


def test_a_lost_master_is_its_own_line_not_another_host_s_failure(tmp_path):
    ending = ending_of(Seen(lost_master="algo-1"))
    result = verdict(ending, Observed(), "algo-2", RunDir(tmp_path))
    assert result.exit_code == ExitCode.FAILED
    assert result.reason.startswith("lost contact with the master host algo-1")


def test_a_stop_after_every_rank_exited_0_is_a_success(tmp_path):
    done = {r: record(rank=r, ended_at=99.0) for r in (0, 1)}
    run = Observed(stop=StopSignal("SIGTERM", 100.0), returncode=1, launched={0, 1}, results=done)
    assert verdict(Ending(EndingKind.STOPPED), run, "algo-1", RunDir(tmp_path)).exit_code == 0


# (each rank's status, when its script ended, when its record was written; whether the stop at
# 100.0 found a finished job): the script's end decides, not the process's; the status its own
STOP_CASES = [
    ([(0, 99.0, 99.1), (0, 98.0, 98.5)], True),  # both done before the stop
    ([(0, 99.9, 100.4), (0, 99.0, 99.2)], True),  # one still in its exit at the stop
    ([(0, None, 99.5), (0, None, 99.0)], True),  # not Python: gone before the stop
    ([(0, 100.1, 100.2), (0, 99.0, 99.1)], False),  # one script still running at the stop
    ([(0, None, 100.5), (0, 99.0, 99.1)], False),  # not Python: gone after the stop
    ([(143, 99.0, 100.3), (0, 99.0, 99.1)], False),  # ended, then exited with a status
    ([(-15, 99.5, 100.2), (0, 99.0, 99.1)], False),  # killed by the stop in its exit
    ([(0, 99.0, 99.1)], False),  # a launched rank left no record at all
]


@pytest.mark.parametrize(("ranks", "finished"), STOP_CASES)
def test_a_stop_after_every_script_ended_with_status_0_is_a_success(tmp_path, ranks, finished):
    results = {
        rank: record(rank=rank, returncode=code, script_ended_at=ended, ended_at=gone)
        for rank, (code, ended, gone) in enumerate(ranks)
    }
    run = stopped_run(launched={0, 1}, results=results)
    result = verdict(STOPPED, run, "algo-1", RunDir(tmp_path))
    assert result.exit_code == (0 if finished else 143), (ranks, result.reason)


def stopped_run(signal_name: str = "SIGTERM", **fields) -> Observed:
    stop = StopSignal(signal_name, 100.0) if signal_name else None
    return Observed(stop=stop, grace=100.0, returncode=0, **fields)


STOPPED = Ending(EndingKind.STOPPED)


def test_a_stop_before_any_rank_started_says_so_not_0_of_0(tmp_path):
    """A stop after torchrun was launched but before any rank's wrapper announced itself once
    read `0 of 0 local ranks exited within 0.0 s`."""
    result = verdict(STOPPED, stopped_run(), "algo-1", RunDir(tmp_path))
    assert result.exit_code == 143
    assert result.reason.endswith("docker stop): the stop came before any rank started")
    assert "0 of 0" not in result.reason


@pytest.mark.parametrize(("name", "code"), [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_stopped_job_exits_128_plus_its_signal(tmp_path, name, code):
    ranks = {
        rank: record(rank=rank, local_rank=rank, stop=StopSignal(name, 100.0), ended_at=101.5)
        for rank in (0, 1)
    }
    run = stopped_run(name, launched={0, 1}, results=ranks)
    result = verdict(STOPPED, run, "algo-1", RunDir(tmp_path))
    assert result.exit_code == code
    assert f"job stopped by {name} on algo-1" in result.reason
    assert result.reason.endswith("all 2 local ranks exited within 1.5 s")


# (launched ranks, ranks with a record, ranks whose script noted its end; whether a stop now
# cut a running script, which the other hosts must hear of before this host's ranks go)
CUT_CASES = [
    (set(), set(), set(), True),  # no rank announced itself yet: the start is cut
    ({0, 1}, set(), set(), True),  # both still running
    ({0, 1}, {0}, set(), True),  # rank 1 still running
    ({0, 1}, set(), {0}, True),  # rank 1 still running, rank 0 in its exit
    ({0, 1}, {0}, {1}, False),  # one ended, one in its exit: the verdict decides, at the end
    ({0, 1}, {0, 1}, set(), False),  # both gone
    ({0, 1}, set(), {0, 1}, False),  # both in their exit
    ({0, 1, 2}, {0, 1}, {0, 1}, True),  # a rank with nothing to show is still running
]


@pytest.mark.parametrize(("launched", "recorded", "ended", "cut"), CUT_CASES)
def test_a_stop_is_told_at_once_only_where_it_cut_a_running_script(launched, recorded, ended, cut):
    results = {r: record(rank=r, script_ended_at=99.0, ended_at=99.5) for r in recorded}
    run = stopped_run(launched=launched, results=results)
    assert stop_cut_a_script(run, ended) is cut


def test_ranks_killed_after_the_grace_are_still_named(tmp_path):
    run = stopped_run(launched={0, 1}, results={0: record(ended_at=101.0)})
    reason = verdict(STOPPED, run, "algo-1", RunDir(tmp_path)).reason
    assert "1 of 2 local ranks exited within 1.0 s; rank 1 still running" in reason


def test_a_rank_killed_by_a_real_time_signal_is_named_and_exits_128_plus_n(tmp_path):
    number = int(signal.SIGRTMIN) + 2
    failed = record(returncode=-number, signal="SIGRTMIN+2")
    run = Observed(returncode=1, results={0: failed}, launched={0})
    result = verdict(Ending(EndingKind.FAILED, failed), run, "algo-1", RunDir(tmp_path))
    assert result.exit_code == 128 + number
    assert result.reason.startswith("rank 0 (local 0) on algo-1: signal SIGRTMIN+2 [first")


def test_the_failure_file_starts_with_the_verdict_then_where_each_rank_was(tmp_path):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "rank-1.txt").write_text(
        "Current thread 0x00007f (most recent call first):\n"
        '  File "/opt/ml/code/train.py", line 8 in stuck\n'
        '  File "/opt/ml/code/train.py", line 12 in <module>\n'
    )
    what = hung_words(600, hosts=2)
    hung = RankRecord(host=None, rank=None, returncode=ExitCode.HUNG, what=what)
    run = Observed()
    run.results[1] = RankRecord(host="algo-2", rank=1, returncode=-15, signal="SIGTERM")
    result = verdict(Ending(EndingKind.HUNG, hung), run, "algo-2", RunDir(tmp_path))
    assert result.exit_code == 124
    assert result.reason == "hung: no output from any rank on any host for 600 s"
    assert result.details[0].startswith("  rank 1 was at train.py:8 in stuck")


def test_a_collective_timeout_s_culprit_comes_first_then_the_first_failure(tmp_path):
    failed = record(
        rank=0, host="algo-1", returncode=1, summary="rank 0 on algo-1: exit code 1: timed out"
    )
    culprit = "rank 3 on algo-2 never entered all_reduce #5 of the default group"
    result = verdict(
        Ending(EndingKind.PEER_FAILED, failed, culprit=culprit),
        Observed(),
        "algo-2",
        RunDir(tmp_path),
    )
    assert result.reason == (
        f"collective timed out: {culprit}; rank 0 on algo-1: exit code 1: timed out [first failure]"
    )
    plain = verdict(Ending(EndingKind.PEER_FAILED, failed), Observed(), "algo-2", RunDir(tmp_path))
    assert plain.reason == "rank 0 on algo-1: exit code 1: timed out [first failure]"


@pytest.mark.parametrize(
    ("fields", "timed_out"),
    [
        (
            {
                "exception": {
                    "type": "RuntimeError",
                    "message": "[gloo] Timed out waiting 1800000ms for recv operation to complete",
                }
            },
            True,
        ),
        (
            {
                "stderr_tail": [
                    "[rank1]:[E] Watchdog caught collective operation timeout: "
                    "WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 ms"
                ]
            },
            True,
        ),
        (
            {
                "summary": "rank 2 on algo-2: signal SIGABRT (hint: a collective timed out: a peer "
                "rank hung or died)"
            },
            True,
        ),
        ({"exception": {"type": "ValueError", "message": "bad batch"}}, False),
        ({"last_words": "Killed"}, False),
    ],
    ids=["gloo", "nccl-watchdog", "relayed-words", "an-exception", "killed"],
)
def test_a_collective_timeout_is_told_by_what_the_rank_left(fields, timed_out):
    from container_entry.diagnose.failure import is_collective_timeout

    assert is_collective_timeout(record(rank=0, host="algo-1", returncode=1, **fields)) is timed_out
