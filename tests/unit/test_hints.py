"""Failure hints from what a rank kept: its exception, stderr tail and the tail of its log.
The log texts stand in for what torch, NCCL and DataLoader workers print on a GPU host."""

from container_entry.common.records import RankRecord
from container_entry.diagnose.failure import hint

WATCHDOG = (
    "[rank1]:[E1203 07:00:00.000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600012 milliseconds before timing out."
)
SHM = "RuntimeError: unable to write to file </torch_1234_567_0>: No space left on device (28)"
DATALOADER = (
    "RuntimeError: DataLoader worker (pid 77) is killed by signal: Bus error. It is possible "
    "that dataloader's workers are out of shared memory. Please try to raise your shared memory "
    "limit."
)
NCCL_SHM = "algo-1:51:60 [0] include/shm.h:28 NCCL WARN Error: failed to extend /dev/shm/nccl-x"


def record(tmp_path=None, log_lines=(), **fields) -> RankRecord:
    log = None
    if tmp_path is not None:
        log = tmp_path / "rank-1.log"
        log.write_text("\n".join(log_lines) + "\n")
    return RankRecord(
        **{"host": "algo-1", "rank": 1, "local_rank": 1, "log": log and str(log), **fields}
    )


def test_watchdog_above_long_stacks_wins_over_sigabrt(tmp_path):
    """The timeout line, then C++ frames and every thread's faulthandler stack (far more than
    the 40 lines of stderr kept in the record), then SIGABRT."""
    stacks = [f"frame #{i}: c10d::ProcessGroupNCCL::watchdog() + 0x{i:x}" for i in range(60)]
    stacks += [
        f'  File "/opt/venv/lib/python3.11/site-packages/x.py", line {i} in f' for i in range(200)
    ]
    failed = record(tmp_path, [WATCHDOG, *stacks], returncode=-6, stderr_tail=stacks[-40:])
    assert hint(failed) == "a collective timed out: a peer rank hung or died"
    assert hint(record(returncode=-6, stderr_tail=stacks[-40:])).startswith("aborted (SIGABRT)")


def test_shared_memory_symptoms_name_the_docker_flags(tmp_path):
    for text in (
        SHM,
        DATALOADER,
        NCCL_SHM,
        "OSError: [Errno 28] No space left on device: '/dev/shm/x'",
    ):
        advice = hint(record(returncode=1, stderr_tail=[text]))
        assert advice is not None and "--shm-size" in advice and "--ipc=host" in advice, text
    assert "--shm-size" in hint(record(returncode=-7))  # SIGBUS on a page of a full /dev/shm
    # other disks filling up are not shared memory
    assert (
        hint(record(returncode=1, stderr_tail=["OSError: No space left on device: '/opt/ml'"]))
        is None
    )


def test_cuda_oom_still_wins_and_old_hints_stay():
    assert "GPU out of memory" in hint(
        record(
            returncode=1,
            exception={"type": "torch.OutOfMemoryError", "message": "CUDA out of memory."},
        )
    )
    assert "out of host memory" in hint(record(returncode=-9))
    assert "segfault" in hint(record(returncode=-11))
    assert hint(record(returncode=1)) is None


def test_a_missing_log_is_no_error(tmp_path):
    missing = RankRecord(host="h", rank=0, returncode=1, log=str(tmp_path / "gone.log"))
    assert hint(missing) is None


def test_a_full_write_that_names_no_file_is_shared_memory_only_when_shm_is_docker_small(
    monkeypatch,
):
    """`handle.write()` to a full /dev/shm raises ENOSPC naming no file. Stands in for the
    container's /dev/shm size (statvfs; the docker test measures the real 64 MiB one)."""
    from container_entry.diagnose import failure

    text = "OSError: [Errno 28] No space left on device"
    monkeypatch.setattr(failure, "read_shm_bytes", lambda path="/dev/shm": 64 << 20)
    assert "--shm-size" in hint(record(returncode=1, stderr_tail=[text]))
    named = "OSError: [Errno 28] No space left on device: '/opt/ml/model/x.bin'"
    assert hint(record(returncode=1, stderr_tail=[named])) is None  # another disk, named
    monkeypatch.setattr(failure, "read_shm_bytes", lambda path="/dev/shm": 8 << 30)
    assert hint(record(returncode=1, stderr_tail=[text])) is None  # a large shm: not it


def our_lines(tmp_path) -> list[str]:
    """Every line the bootstrap prints into a rank's own output (so into its stderr tail and
    its log): the preflight's, the rank wrapper's, the script's exit teardown (sitecustomize),
    in the texts they are made of here, with the words a hint looks for."""
    import os

    from container_entry.common import shm
    from container_entry.common.logs import PREFIX
    from container_entry.rank import preflight_checks

    small = shm.warning(64 << 20)
    assert small is not None
    real_statvfs = os.statvfs
    os.statvfs = lambda path: type("S", (), {"f_frsize": 4096, "f_blocks": 16384})()  # type: ignore
    try:
        warning = preflight_checks.shm_line("algo-1")
    finally:
        os.statvfs = real_statvfs
    assert warning is not None and small in warning
    return [
        warning,
        f"{PREFIX} preflight ok on algo-1: 2 workers, 0 GPUs, all_reduce latency 0.3 ms",
        f"{PREFIX} preflight's NCCL: {NCCL_SHM}",
        f"{PREFIX} preflight's NCCL: {WATCHDOG}",
        f"{PREFIX} rank log /opt/ml/output/data/container-entry/logs/rank-1.log stopped at "
        "1,024 bytes: No space left on device; the console still has every line",
        f"{PREFIX} console (stdout) stopped: Broken pipe; the rank log still has every line",
        f"{PREFIX} ending the process groups at exit: RuntimeError: Connection closed by peer",
        f"{PREFIX} the process groups' teardown at exit took over 10 s; exiting without it",
    ]


# each hint's signature: a failure whose own words carry it, and its advice's first words
SIGNATURES = {
    "shm": (SHM, "shared memory"),
    "watchdog": (WATCHDOG, "a collective timed out"),
    "cuda-oom": ("torch.OutOfMemoryError: CUDA out of memory.", "GPU out of memory"),
    "segfault": ("Segmentation fault (core dumped)", "crashed in native code"),
}


def test_no_line_of_ours_is_ever_taken_for_a_hint(tmp_path):
    """A script that fails of a SyntaxError on a host whose /dev/shm is small (docker's 64 MiB:
    the preflight warns, in the rank's own output, with "No space left on device" and
    "/dev/shm") gets no hint: the hint reads what the script printed, never our lines."""
    mine = our_lines(tmp_path)
    for line in mine:
        failed = record(
            tmp_path,
            [line, "SyntaxError: invalid syntax (probe.py, line 18)"],
            returncode=1,
            exception={"type": "SyntaxError", "message": "invalid syntax (probe.py, line 18)"},
            stderr_tail=[line, "SyntaxError: invalid syntax (probe.py, line 18)"],
            last_words="SyntaxError: invalid syntax (probe.py, line 18)",
        )
        assert hint(failed) is None, line
    for name, (words, advice) in SIGNATURES.items():  # the same words from the script do count
        failed = record(tmp_path, [*mine, words], returncode=1, stderr_tail=[*mine, words])
        assert (hint(failed) or "").startswith(advice), name
