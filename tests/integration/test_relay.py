"""The output relay in real processes: the bootstrap, torchrun, the per-rank wrappers and small
scripts (no torch in them) writing to stdout and stderr. One test per guarantee: lines are live,
tagged, in order, masked, logged per rank, kept when the script crashes, filtered by
CONSOLE_RANKS, and the workers' stderr reaches the container's stderr without passing through
the bootstrap (whatever that stderr is: a pipe, a regular file, or a socket as a fallback)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from tests.integration.conftest import (
    bootstrap_argv,
    bootstrap_env,
    control_dir,
    make_tree,
)
from tests.ports import job_port

LOGS = "data/container-entry/logs"
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
TAG = re.compile(rb"^\[algo-1 rank (\d+)\] (.*)$")


def start(tmp_path, source, nproc=2, hyperparameters=None, stderr=subprocess.PIPE, **env):
    env.setdefault("CONTAINER_ENTRY_MASTER_PORT", str(job_port()))
    script = tmp_path / "relay_script.py"
    script.write_text(source)
    tree = make_tree(tmp_path, script=script)
    if hyperparameters:
        (tree.base / "input/config/hyperparameters.json").write_text(json.dumps(hyperparameters))
    environment = bootstrap_env(
        tree, SAGEMAKER_PROGRAM="relay_script.py", PET_NPROC_PER_NODE=str(nproc), **env
    )
    process = subprocess.Popen(
        bootstrap_argv(), env=environment, stdout=subprocess.PIPE, stderr=stderr, cwd="/"
    )
    return tree, process


class Reader(threading.Thread):
    """Every line of one of the bootstrap's output streams, with the time it arrived."""

    def __init__(self, stream, on_line=None) -> None:
        super().__init__(daemon=True)
        self.stream, self.lines, self.on_line = stream, [], on_line

    def run(self) -> None:
        for line in iter(self.stream.readline, b""):
            self.lines.append((time.time(), line.rstrip(b"\n")))
            if self.on_line:
                self.on_line(line.rstrip(b"\n"))

    def text(self) -> list[bytes]:
        return [line for _, line in self.lines]


def run_to_end(process, timeout=180, on_line=None):
    readers = [Reader(process.stdout, on_line)]
    if process.stderr is not None:
        readers.append(Reader(process.stderr, on_line))
    for reader in readers:
        reader.start()
    process.wait(timeout=timeout)
    for reader in readers:
        reader.join(timeout=30)
    return readers


def tagged(lines: list[bytes], rank: int) -> list[bytes]:
    found = []
    for line in lines:
        match = TAG.match(line)
        if match and int(match.group(1)) == rank:
            found.append(match.group(2))
    return found


def rank_log(tree, rank: int) -> bytes:
    return (tree.output / LOGS / f"rank-{rank}.log").read_bytes()


def record(tree, rank: int) -> dict:
    return json.loads((tree.output / f"data/container-entry/rank-{rank}.json").read_text())


# Each timed line is followed by a quiet spell that lasts until the test has seen it on the
# container's stream (an ack file per line): a relay that held a line until more output came,
# or until the end, keeps its rank waiting until the 20 s give-up, which says `late`. The test
# judges that event, not a wall-clock margin that a loaded machine can exceed (run 51 in
# docs/test-speed.md: one line took 1.96 s beside a CPU hog, under a 1 s bound).
LIVE = """
import os, sys, time
rank = int(os.environ["RANK"])
acks = os.environ["ACK_DIR"]
late = []
def quiet_until_seen(i):
    deadline = time.time() + 20
    while not late and not all(os.path.exists(f"{acks}/{s}-{rank}-{i}") for s in ("out", "err")):
        if time.time() > deadline:
            late.append(i)  # said once; the rest go on without waiting
            print(f"late {i} rank {rank}", file=sys.stderr)
        time.sleep(0.01)
for i in range(8):
    print(f"out {i} rank {rank} t={time.time():.6f}")
    print(f"err {i} rank {rank} t={time.time():.6f}", file=sys.stderr)
    if i == 4:  # a burst between two timed lines
        for j in range(3000):
            print(f"burst {j} rank {rank}", file=sys.stderr if j % 2 else sys.stdout)
    quiet_until_seen(i)
"""
TIMED = re.compile(rb"^\[algo-1 rank \d+\] (out|err) (\d+) rank (\d+) t=")


def test_every_line_on_both_streams_is_live_through_quiet_spells_and_bursts(tmp_path):
    acks = tmp_path / "acks"
    acks.mkdir()

    def seen(line: bytes) -> None:
        match = TIMED.match(line)
        if match:
            stream, i, rank = (x.decode() for x in match.groups())
            (acks / f"{stream}-{rank}-{i}").touch()

    tree, process = start(tmp_path, LIVE, ACK_DIR=str(acks))
    out, err = run_to_end(process, on_line=seen)
    assert process.returncode == 0, err.text()[-20:]
    assert not [line for line in err.text() if b"] late " in line]  # every line seen while quiet
    timed = {b"out": 0, b"err": 0}
    for reader, stream in ((out, b"out"), (err, b"err")):
        for _, line in reader.lines:
            match = TIMED.match(line)
            timed[stream] += bool(match and match.group(1) == stream)
    assert timed == {b"out": 16, b"err": 16}
    for rank in (0, 1):
        assert len([x for x in tagged(out.text(), rank) if x.startswith(b"burst")]) == 1500
        assert len([x for x in tagged(err.text(), rank) if x.startswith(b"burst")]) == 1500
        assert rank_log(tree, rank).count(b"burst ") == 3000


ORDER = """
import os, sys
rank = int(os.environ["RANK"])
for i in range(20000):
    print(f"o {i}")
    sys.stderr.write(f"e {i}\\n" if i % 3 else f"e {i}")  # some lines end in the next write
    if i % 3 == 0:
        sys.stderr.write("\\n")
"""


def test_order_within_each_stream_is_kept_on_the_console_and_in_the_log(tmp_path):
    tree, process = start(tmp_path, ORDER)
    out, err = run_to_end(process)
    assert process.returncode == 0, err.text()[-20:]
    expected_out = [f"o {i}".encode() for i in range(20000)]
    expected_err = [f"e {i}".encode() for i in range(20000)]
    for rank in (0, 1):
        assert tagged(out.text(), rank) == expected_out
        assert tagged(err.text(), rank) == expected_err
        log = rank_log(tree, rank).splitlines()
        assert [x for x in log if x.startswith(b"o ")] == expected_out
        assert [x for x in log if x.startswith(b"e ")] == expected_err


PROGRESS = """
import sys, time
for percent in (10, 50, 100):
    sys.stderr.write(f"\\rprogress {percent:3d}%|" + "#" * (percent // 10))
    sys.stderr.flush()
    time.sleep(0.1)
sys.stderr.write("\\r\\n")
print("done")
"""


def test_carriage_return_progress_lines_are_shown(tmp_path):
    tree, process = start(tmp_path, PROGRESS, nproc=1)
    _, err = run_to_end(process)
    assert process.returncode == 0, err.text()[-20:]
    shown = tagged(err.text(), 0)
    for expected in (b"progress  10%|#", b"progress  50%|#####", b"progress 100%|##########"):
        assert expected in shown, shown
        assert expected in rank_log(tree, 0).splitlines()
    assert not any(b"\r" in line for _, line in err.lines)


CRASH = """
import ctypes, os, signal, sys
for i in range(2000):
    print(f"before the crash {i}")
    print(f"stderr before the crash {i}", file=sys.stderr)
sys.stdout.write("an unterminated last line")
if sys.argv[-1] == "segfault":
    ctypes.string_at(0)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_nothing_written_before_a_crash_is_lost(tmp_path):
    for how, code, sig in (("segfault", 139, "SIGSEGV"), ("sigkill", 137, "SIGKILL")):
        root = tmp_path / how
        root.mkdir()
        tree, process = start(root, CRASH, nproc=1, hyperparameters={"how": json.dumps(how)})
        out, err = run_to_end(process)
        assert process.returncode == code, err.text()[-20:]
        shown_out, shown_err = tagged(out.text(), 0), tagged(err.text(), 0)
        log = rank_log(tree, 0).splitlines()
        for i in (0, 1999):
            assert f"before the crash {i}".encode() in shown_out
            assert f"stderr before the crash {i}".encode() in shown_err
            assert f"before the crash {i}".encode() in log
        assert sum(line.startswith(b"before the crash") for line in log) == 2000
        assert b"an unterminated last line" in shown_out and b"an unterminated last line" in log
        rank0 = record(tree, 0)
        assert rank0["signal"] == sig
        if how == "segfault":  # faulthandler's report, from the stderr tail
            assert rank0["fatal_error"] == "Segmentation fault"
            assert any("Fatal Python error" in line for line in rank0["stderr_tail"])


FILTERED = """
import os, sys
rank = int(os.environ["RANK"])
print(f"stdout line rank {rank}")
print(f"stderr line rank {rank}", file=sys.stderr)
"""


def test_console_ranks_filters_both_streams_and_every_rank_is_still_logged(tmp_path):
    tree, process = start(tmp_path, FILTERED, CONTAINER_ENTRY_CONSOLE_RANKS="0")
    out, err = run_to_end(process)
    assert process.returncode == 0, err.text()[-20:]
    console = b"\n".join(out.text() + err.text())
    assert b"[algo-1 rank 0] stdout line rank 0" in console
    assert b"[algo-1 rank 0] stderr line rank 0" in console
    assert b"rank 1" not in console
    assert set(rank_log(tree, 1).splitlines()) == {b"stdout line rank 1", b"stderr line rank 1"}


SECRETS = """
import sys
token = sys.argv[sys.argv.index("--hf_token") + 1]
print("argv:", sys.argv)
print("argv:", sys.argv, file=sys.stderr)
sys.stdout.write("split " + token[:6])
sys.stdout.flush()
sys.stdout.write(token[6:] + " across two writes\\n")
raise ValueError(f"bad token {token}")
"""


def test_secrets_are_masked_on_the_console_in_the_log_and_in_the_record(tmp_path):
    secret = "hf_TOPSECRET123"
    tree, process = start(
        tmp_path, SECRETS, nproc=1, hyperparameters={"hf_token": json.dumps(secret)}
    )
    out, err = run_to_end(process)
    assert process.returncode == 1
    everything = b"\n".join(out.text() + err.text()) + rank_log(tree, 0)
    everything += (tree.output / "data/container-entry/rank-0.json").read_bytes()
    everything += (tree.output / "failure").read_bytes()
    assert b"TOPSECRET" not in everything
    assert b"split **** across two writes" in tagged(out.text(), 0)
    rank0 = record(tree, 0)
    assert rank0["exception"] == {"type": "ValueError", "message": "bad token ****"}
    assert "ValueError: bad token ****" in rank0["stderr_tail"]


WAIT = """
import os, sys, time
rank = int(os.environ["RANK"])
print(f"ready rank {rank}", file=sys.stderr)
release = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "release")
while not os.path.exists(release):
    time.sleep(0.05)
for i in range(500):
    print(f"after release {i} rank {rank}", file=sys.stderr)
"""


def wait_for_lines(reader: Reader, needle: bytes, count: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(needle in line for line in reader.text()) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} x {needle!r} not seen: {reader.text()[-10:]}")


def fd_targets(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return found


def test_worker_stderr_goes_straight_to_the_bootstraps_stderr(tmp_path):
    tree, process = start(tmp_path, WAIT)
    out, err = Reader(process.stdout), Reader(process.stderr)
    out.start()
    err.start()
    try:
        wait_for_lines(err, b"] ready rank", 2)
        ours = os.readlink(f"/proc/{process.pid}/fd/2")
        assert ours.startswith("pipe:")
        pids = [json.loads(p.read_text()) for p in control_dir(process.pid).glob("rank-*.pid")]
        assert len(pids) == 2
        for entry in pids:
            wrapper = entry["wrapper"]
            # the wrapper's own fd 2 is torchrun's stderr pipe; its console is ours
            assert os.readlink(f"/proc/{wrapper}/fd/2") != ours
            assert ours in fd_targets(wrapper)
    finally:
        (tree.output / "data" / "release").touch()
        process.wait(timeout=120)
        out.join(timeout=30)
        err.join(timeout=30)
    assert process.returncode == 0
    for rank in (0, 1):
        assert len([x for x in tagged(err.text(), rank) if x.startswith(b"after release")]) == 500


BURST = """
import os, sys
rank = int(os.environ["RANK"])
for i in range(5000):
    print(f"line {i} rank {rank} " + "x" * (i % 200), file=sys.stderr)
"""


def test_a_regular_file_as_stderr_loses_no_line_of_the_bootstrap_or_the_workers(tmp_path):
    path = tmp_path / "stderr.txt"
    with open(path, "wb") as handle:  # not in append mode: the bootstrap makes it so
        _tree, process = start(tmp_path, BURST, stderr=handle)
        run_to_end(process)
    assert process.returncode == 0
    lines = path.read_bytes().splitlines()
    for rank in (0, 1):
        expected = [f"line {i} rank {rank} ".encode() + b"x" * (i % 200) for i in range(5000)]
        assert tagged(lines, rank) == expected
    ours = [line for line in lines if line.startswith(b"[container-entry]")]
    assert ours, lines[:5]
    assert all(TAG.match(line) or line.startswith(b"[container-entry]") for line in lines if line)


def test_a_socket_as_stderr_falls_back_to_torchruns_pipe_and_loses_nothing(tmp_path):
    ours, theirs = socket.socketpair()
    received = bytearray()

    def drain() -> None:
        while chunk := ours.recv(65536):
            received.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    _tree, process = start(tmp_path, BURST, stderr=theirs.fileno())
    theirs.close()
    run_to_end(process)
    reader.join(timeout=30)
    ours.close()
    assert process.returncode == 0
    lines = bytes(received).splitlines()
    for rank in (0, 1):
        assert len(tagged(lines, rank)) == 5000


SLEEPER = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
def on_term(signum, frame):
    print(f"got SIGTERM rank {rank}", file=sys.stderr)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print(f"ready rank {rank}", file=sys.stderr)
time.sleep(120)
"""


def test_torchruns_own_lines_are_hidden_during_a_stop_but_the_ranks_last_lines_are_not(tmp_path):
    _tree, process = start(tmp_path, SLEEPER)
    out, err = Reader(process.stdout), Reader(process.stderr)
    out.start()
    err.start()
    wait_for_lines(err, b"] ready rank", 2)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    out.join(timeout=30)
    err.join(timeout=30)
    assert process.returncode == 143
    for rank in (0, 1):
        assert f"got SIGTERM rank {rank}".encode() in tagged(err.text(), rank)
    untagged = [x for x in err.text() if not TAG.match(x) and not x.startswith(b"[container-")]
    assert not [x for x in untagged if b"SignalException" in x or b"Traceback" in x], untagged


def test_torchruns_own_lines_reach_the_failure_report(tmp_path):
    tree, process = start(tmp_path, SLEEPER, nproc=1)
    out, err = Reader(process.stdout), Reader(process.stderr)
    out.start()
    err.start()
    wait_for_lines(err, b"] ready rank", 1)
    (entry,) = [json.loads(p.read_text()) for p in control_dir(process.pid).glob("rank-*.pid")]
    os.kill(entry["wrapper"], signal.SIGKILL)  # the wrapper dies: no record, torchrun fails
    process.wait(timeout=60)
    out.join(timeout=30)
    err.join(timeout=30)
    assert process.returncode != 0
    first = (tree.output / "failure").read_text().splitlines()[0]
    assert "torchrun on algo-1 failed" in first and "before any rank reported" in first, first
    assert not first.endswith("no output"), first
    # and they were shown: nothing had started a teardown yet
    assert any(not TAG.match(x) and b"SIGKILL" in x for x in err.text()), err.text()[-20:]


LONG_LINES = """
import os, sys
rank = int(os.environ["RANK"])
stream = sys.stderr if "--stderr" in sys.argv else sys.stdout
for i in range(300):
    head = f"long {i} rank {rank} "
    stream.write(head + "y" * (20_000 - len(head)) + "\\n")
"""


def test_lines_longer_than_pipe_buf_from_two_ranks_stay_whole_on_a_piped_console(tmp_path):
    """2 ranks x 300 lines of 20 KB on each piped stream: a write longer than PIPE_BUF to a
    pipe could be cut by another rank's bytes (95 of 600 lines spliced or untagged, before the
    console lock); now every line arrives whole and tagged."""
    jobs = {}
    for stream in ("stdout", "stderr"):  # both jobs at once: half the time
        root = tmp_path / stream
        root.mkdir()
        hps = {"stderr": "true"} if stream == "stderr" else None
        tree, process = start(root, LONG_LINES, hyperparameters=hps)
        for pipe in (process.stdout, process.stderr):  # one page: every long write blocks
            fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, 4096)
        readers = [Reader(process.stdout), Reader(process.stderr)]
        for reader in readers:
            reader.start()
        jobs[stream] = tree, process, readers
    whole = re.compile(rb"\[algo-1 rank (\d)\] long \d+ rank \1 y+")
    size = 20_000 + len(b"[algo-1 rank 0] ")
    for stream, (tree, process, (out, err)) in jobs.items():
        process.wait(timeout=180)
        out.join(timeout=30)
        err.join(timeout=30)
        assert process.returncode == 0, err.text()[-20:]
        lines = [line for line in (out if stream == "stdout" else err).text() if b"long " in line]
        spliced = [x[:80] for x in lines if not whole.fullmatch(x) or len(x) != size]
        assert len(lines) == 600 and not spliced, (stream, len(lines), len(spliced), spliced[:5])
        for rank in (0, 1):
            assert len(rank_log(tree, rank).splitlines()) == 300


FILLER = """
import os, sys
rank = int(os.environ["RANK"])
for step in range(4000):
    print(f"step {step} rank {rank} " + "f" * 200)
    if step % 10 == 0:
        print(f"stderr step {step} rank {rank}", file=sys.stderr)
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"done-{rank}"), "w") as handle:
    handle.write(str(step))
"""


# the full-disk test's hang timeout: above a rank's start-up beside a busy suite (5 s was not)
FULL_DISK_HANG_TIMEOUT = 10
SLOW_TAIL = f"""
import time
for i in range({FULL_DISK_HANG_TIMEOUT + 4}):  # longer than the hang timeout, after the log stopped
    print(f"tail {{i}} rank {{rank}}", flush=True)
    time.sleep(1.0)
"""


def on_tiny_tmpfs(argv: list[str], folder, size: str, keep) -> list[str]:
    """argv in a private mount namespace where `folder` is a tmpfs of `size` (needs root): a
    disk that really fills up, the machine's mounts untouched. What argv left there is copied
    to `keep` when it exits (the tmpfs goes with the namespace)."""
    script = (
        'mount -t tmpfs -o size="$1" tmpfs "$0" || exit 99; dest="$2"; shift 2; "$@"; code=$?; '
        'cp -a "$0/." "$dest"; exit $code'
    )
    return ["unshare", "--mount", "--", "sh", "-c", script, str(folder), size, str(keep), *argv]


def test_a_full_disk_under_the_rank_logs_never_ends_training(tmp_path):
    """The run folder (rank logs and records) on a 256 KiB tmpfs that the ranks' output fills
    (ENOSPC for real): the wrapper once died of `OSError: [Errno 28]` and took its healthy rank
    with it. Now each rank trains to its last step, the console has every line, each rank says
    once that its log stopped and why, its record says so too, and the job exits 0; and the
    hang watchdog still sees it print (its log's time is kept fresh)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("needs root and unshare (CI runs as root)")
    script = tmp_path / "relay_script.py"
    script.write_text(FILLER + SLOW_TAIL)
    tree = make_tree(tmp_path, script=script)
    run_dir = tree.output / "data/container-entry"
    run_dir.mkdir(parents=True)
    kept = tmp_path / "run-folder"
    kept.mkdir()
    env = bootstrap_env(
        tree,
        SAGEMAKER_PROGRAM="relay_script.py",
        PET_NPROC_PER_NODE="2",
        CONTAINER_ENTRY_MASTER_PORT=str(job_port()),
        # the watchdog reads the logs' times: a rank whose log stopped is not idle
        CONTAINER_ENTRY_HANG_TIMEOUT=str(FULL_DISK_HANG_TIMEOUT),
    )
    process = subprocess.Popen(
        on_tiny_tmpfs(bootstrap_argv(), run_dir, "256k", kept),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
    )
    out, err = run_to_end(process)
    assert process.returncode == 0, b"\n".join(err.text()[-30:])
    for rank in (0, 1):
        assert (tree.output / f"data/done-{rank}").read_text() == "3999"
        steps = [line for line in tagged(out.text(), rank) if line.startswith(b"step ")]
        assert len(steps) == 4000 and steps[-1].startswith(b"step 3999 ")
        last = FULL_DISK_HANG_TIMEOUT + 3
        assert f"tail {last} rank {rank}".encode() in tagged(out.text(), rank)
        assert len([x for x in tagged(err.text(), rank) if x.startswith(b"stderr step")]) == 400
        ours = b"[container-entry] rank log"
        notices = [x for x in tagged(err.text(), rank) if x.startswith(ours)]
        assert len(notices) == 1, notices
        assert re.fullmatch(
            rb"\[container-entry\] rank log \S+/logs/rank-%d\.log stopped at [\d,]+ bytes: "
            rb"No space left on device; the console still has every line" % rank,
            notices[0],
        ), notices
        # the record was written all the same (space kept for it), and says so
        kept_record = json.loads((kept / f"rank-{rank}.json").read_text())
        assert kept_record["returncode"] == 0
        assert notices[0].decode().startswith(f"[container-entry] {kept_record['log_error']}")
    assert not (tree.output / "failure").exists()
    assert (tree.output / "success").exists()


def test_a_console_nobody_reads_never_ends_training_and_the_log_keeps_every_line(tmp_path):
    """The container's stdout closed by its reader (EPIPE): each rank stops writing there once,
    says so in its log and record, and trains on; the log has every line."""
    tree, process = start(tmp_path, FILLER.replace("4000", "500"))
    process.stdout.close()
    err = Reader(process.stderr)
    err.start()
    process.wait(timeout=180)
    err.join(timeout=30)
    assert process.returncode == 0, err.text()[-20:]
    for rank in (0, 1):
        log = rank_log(tree, rank).splitlines()
        assert len([x for x in log if x.startswith(b"step ")]) == 500
        notice = b"[container-entry] console (stdout) stopped: Broken pipe; the rank log still has"
        assert sum(x.startswith(notice) for x in log) == 1
        assert record(tree, rank)["console_error"] == "console (stdout) stopped: Broken pipe"
        assert len([x for x in tagged(err.text(), rank) if x.startswith(b"stderr step")]) == 50
