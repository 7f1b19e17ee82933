"""No child of the bootstrap outlives it (container_entry/common/offspring.py), however it was
started and wherever a stop cut in. Each case runs in a Python of its own: `end_all` kills every
child of the process it runs in, and a pytest worker has children of its own (registries,
servers)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

# the children a bootstrap may hold at its end, one of each kind; the script prints their pids
_CHILDREN = r"""
import os, signal, subprocess, sys, time
from container_entry.common import offspring

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
IGNORE_TERM = [sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
# a group leader whose child stays in its group (pip and its build step)
WITH_CHILD = [sys.executable, "-c",
    f"import subprocess, time; c = subprocess.Popen({SLEEP!r}); print(c.pid, flush=True); "
    "time.sleep(600)"]

pids = []
kept = subprocess.Popen(SLEEP)                      # a helper in the bootstrap's own group
pids.append(kept.pid)
pids.append(subprocess.Popen(IGNORE_TERM).pid)      # its Popen lost (a stop inside Popen)
leader = subprocess.Popen(WITH_CHILD, process_group=0, stdout=subprocess.PIPE, text=True)
pids += [leader.pid, int(leader.stdout.readline())]  # torchrun's group, its grandchild
pids.append(subprocess.Popen(SLEEP, start_new_session=True).pid)  # a session of its own
done = subprocess.Popen([sys.executable, "-c", "pass"])
done.wait()
time.sleep(0.2)
ended = offspring.end_all()
print(" ".join(map(str, pids)), flush=True)
print(" ".join(map(str, sorted(ended))), flush=True)
remaining = [c for c in os.listdir(f"/proc/{os.getpid()}/task") for c in
    open(f"/proc/{os.getpid()}/task/{c}/children").read().split()]
print(" ".join(remaining), flush=True)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_end_all_ends_every_child_kind_and_its_group_and_reaps_them():
    """Kept or lost, in the bootstrap's group, leading its own (with a grandchild in it) or in
    a session of its own, ignoring SIGTERM: all gone, none left a zombie, the direct children
    named; a child that already exited is no concern."""
    result = python(_CHILDREN)
    assert result.returncode == 0, result.stderr
    started, ended, remaining = result.stdout.splitlines()
    pids = [int(pid) for pid in started.split()]
    grandchild = pids[3]
    assert sorted(int(pid) for pid in ended.split()) == sorted(
        pid for pid in pids if pid != grandchild
    )
    assert remaining == ""  # reaped: not even a zombie left to the bootstrap
    deadline = time.monotonic() + 30
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if alive(pid)]


def test_end_all_with_nothing_left_does_nothing():
    result = python("from container_entry.common import offspring; print(offspring.end_all())")
    assert result.returncode == 0 and result.stdout.strip() == "[]", result


# a helper whose child stays in its group, cut by a stop (the handler raises, as Stop's does
# before the workers start) or by its timeout; prints the pids, then what happened
_HELPER = r"""
import os, signal, sys, subprocess, threading, time
from container_entry.common import offspring

class Stopped(Exception):
    pass

def raise_stop(signum, frame):
    raise Stopped()

signal.signal(signal.SIGTERM, raise_stop)
# a shell starts in milliseconds: its pids are out long before the 5-s timeout, however busy
argv = ["sh", "-c", "sleep 600 & echo $$ $!; exec sleep 600"]
how = sys.argv[1]

def stop_once_started():  # the stop once the helper and its child are up (no fixed sleep)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open("pids.txt") as pids:
            if len(pids.read().split()) == 2:
                break
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)

with open("pids.txt", "w") as out:
    if how == "stop":
        threading.Thread(target=stop_once_started, daemon=True).start()
    try:
        offspring.run(argv, stdout=out, timeout=5 if how == "timeout" else 60)
    except (Stopped, subprocess.TimeoutExpired) as error:
        print(type(error).__name__, flush=True)
"""


@pytest.mark.parametrize("how", ["stop", "timeout"])
def test_a_helper_cut_by_a_stop_or_its_timeout_is_ended_with_its_own_children(tmp_path, how):
    """subprocess.run kills the direct child only: pip's build step ran on. offspring.run
    ends the helper's whole group before the exception goes on."""
    result = subprocess.run(
        [sys.executable, "-c", _HELPER, how],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == {"stop": "Stopped", "timeout": "TimeoutExpired"}[how]
    pids = [int(pid) for pid in (tmp_path / "pids.txt").read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 30
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if alive(pid)]


def test_run_answers_as_subprocess_run_does(tmp_path):
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    argv = [sys.executable, "-c", script]
    from container_entry.common import offspring

    ours = offspring.run(argv, capture_output=True, text=True)
    theirs = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert (ours.returncode, ours.stdout, ours.stderr) == (3, "out\n", "err\n")
    assert (ours.returncode, ours.stdout, ours.stderr) == (
        theirs.returncode,
        theirs.stdout,
        theirs.stderr,
    )
    with pytest.raises(subprocess.CalledProcessError) as raised:
        offspring.run(argv, capture_output=True, text=True, check=True)
    assert raised.value.returncode == 3 and raised.value.stdout == "out\n"
    with pytest.raises(FileNotFoundError):
        offspring.run([str(tmp_path / "no-such-binary")])
