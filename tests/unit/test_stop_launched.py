"""A stop for a tree the user's own launcher started (common.workers.stop_launched), on real
processes: every process that handles the signal gets it, and every one without a child; a
launcher without a handler is left to end with its workers (its death would end them early:
torch.multiprocessing.spawn's workers get SIGINT when their parent dies)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from container_entry.common.workers import children, descendants, stop_launched

# a launcher with no handler; a worker that handles SIGTERM (notes it), one that does not, in a
# session of its own (as torchrun starts its workers)
HANDLES = """
import signal, sys, time
def noted(*_):
    open(sys.argv[1], "w").write("noted")
    sys.exit(0)
signal.signal(signal.SIGTERM, noted)
print("ready", flush=True)
time.sleep(60)
"""
PLAIN = "import time; print('ready', flush=True); time.sleep(60)"
TREE = f"""
import subprocess, sys
out = sys.argv[1]
workers = [
    subprocess.Popen([sys.executable, "-c", {HANDLES!r}, out], stdout=subprocess.PIPE),
    subprocess.Popen(
        [sys.executable, "-c", {PLAIN!r}], stdout=subprocess.PIPE, start_new_session=True
    ),
]
for worker in workers:
    worker.stdout.readline()
print("ready", flush=True)
codes = [worker.wait() for worker in workers]
open(out + ".launcher", "w").write(repr(codes))
"""


def test_the_launcher_without_a_handler_outlives_its_workers_stop(tmp_path: Path):
    noted = tmp_path / "noted"
    launcher = subprocess.Popen(
        [sys.executable, "-c", TREE, str(noted)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None and launcher.stdout.readline() == "ready\n"
        workers = children(launcher.pid)
        assert len(workers) == 2 and len(descendants(launcher.pid)) == 2
        done: set[int] = set()
        stop_launched(launcher.pid, signal.SIGTERM, done)
        assert done == set(workers)  # the launcher (no handler, two children) is spared
        assert launcher.wait(timeout=30) == 0  # it ended on its own, with its workers
        assert noted.read_text() == "noted"  # the worker with a handler ran it
        codes = sorted(eval((tmp_path / "noted.launcher").read_text()))
        assert codes == [-signal.SIGTERM, 0]  # the plain one died of the signal
        stop_launched(launcher.pid, signal.SIGTERM, done)  # nothing left: nothing raised
    finally:
        if launcher.poll() is None:
            launcher.kill()
        time.sleep(0)
