"""A stop for a tree the user's own launcher started (common.workers.stop_launched), on real
processes: every process gets the signal but a launcher that has no handler for it while its
workers run; it ends with them and reports them (the base image's toolkit writes its failure
file; torch.multiprocessing.spawn's workers get SIGINT when their parent dies, which would cut
their checkpoint). A shell dies of the stop as it always did; what it started goes on to the
end of its own handler."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from container_entry.common.workers import children, stop_launched

# a worker that handles SIGTERM: it notes the stop and exits 0
HANDLES = """
import signal, sys, time
def noted(*_):
    open(sys.argv[1], "w").write("noted")
    sys.exit(0)
signal.signal(signal.SIGTERM, noted)
print("ready", flush=True)
time.sleep(60)
"""
# the tutorial's launcher: multiprocessing's spawn (as torch's), no handler of its own
SPAWNS = """
import multiprocessing, os, signal, sys, time

def work(out):
    def noted(*_):
        open(out, "w").write("noted")
        sys.exit(0)
    signal.signal(signal.SIGTERM, noted)
    open(out + ".ready", "w").close()
    time.sleep(60)

if __name__ == "__main__":
    worker = multiprocessing.get_context("spawn").Process(target=work, args=(sys.argv[1],))
    worker.start()
    while not os.path.exists(sys.argv[1] + ".ready"):
        time.sleep(0.05)
    print("ready", flush=True)
    worker.join()
    open(sys.argv[1] + ".launcher", "w").write(str(worker.exitcode))
"""
# the base image's toolkit: a Python launcher with no handler that runs its command through
# subprocess and reports how it ended (it writes the failure file)
REPORTS = """
import subprocess, sys
code = subprocess.call(sys.argv[2:])
open(sys.argv[1] + ".launcher", "w").write(str(code))
"""


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def test_a_multiprocessing_launcher_without_a_handler_outlives_its_workers_stop(tmp_path: Path):
    noted = tmp_path / "noted"
    (tmp_path / "tutorial.py").write_text(SPAWNS)
    launcher = start([sys.executable, str(tmp_path / "tutorial.py"), str(noted)])
    try:
        assert launcher.stdout is not None and launcher.stdout.readline() == "ready\n"
        workers = [p for p in children(launcher.pid) if _catches_term(p)]
        assert len(workers) == 1  # (multiprocessing's resource tracker aside)
        worker = workers[0]
        done: set[int] = set()
        stop_launched(launcher.pid, signal.SIGTERM, done)
        assert launcher.pid not in done and worker in done  # the launcher is spared
        assert launcher.wait(timeout=30) == 0  # it ended on its own, after its worker
        assert noted.read_text() == "noted"  # the worker ran its handler to its end
        assert (tmp_path / "noted.launcher").read_text() == "0"
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_a_launcher_without_a_handler_reports_its_workers_end(tmp_path: Path):
    noted = tmp_path / "noted"
    (tmp_path / "toolkit.py").write_text(REPORTS)
    (tmp_path / "worker.py").write_text(HANDLES)
    worker_argv = [sys.executable, str(tmp_path / "worker.py"), str(noted)]
    launcher = start([sys.executable, str(tmp_path / "toolkit.py"), str(noted), *worker_argv])
    try:
        assert launcher.stdout is not None and launcher.stdout.readline() == "ready\n"
        (worker,) = children(launcher.pid)
        done: set[int] = set()
        stop_launched(launcher.pid, signal.SIGTERM, done)
        assert done == {worker}  # the launcher is spared: it reports its worker's end
        assert launcher.wait(timeout=30) == 0
        assert noted.read_text() == "noted"
        assert (tmp_path / "noted.launcher").read_text() == "0"
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_a_shell_dies_of_the_stop_and_its_worker_runs_its_handler(tmp_path: Path):
    noted = tmp_path / "noted"
    script = f'"{sys.executable}" -c \'{HANDLES}\' "{noted}"; echo after'
    shell = start(["/bin/sh", "-c", script])
    try:
        (worker,) = wait_for_children(shell.pid)
        assert shell.stdout is not None
        done: set[int] = set()
        for _ in range(200):  # until the worker's handler is in place
            if noted.exists() or _catches_term(worker):
                break
            subprocess.run(["sleep", "0.05"], check=True)
        stop_launched(shell.pid, signal.SIGTERM, done)
        assert done == {shell.pid, worker}
        assert shell.wait(timeout=30) == -signal.SIGTERM
        assert "after" not in shell.stdout.read()  # the shell went no further
        for _ in range(200):
            if noted.exists():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert noted.read_text() == "noted"
    finally:
        if shell.poll() is None:
            shell.kill()


def wait_for_children(pid: int, count: int = 1) -> list[int]:
    for _ in range(400):
        found = children(pid)
        if len(found) >= count:
            return found
        subprocess.run(["sleep", "0.05"], check=True)
    raise AssertionError(f"no {count} children of {pid}")


def _catches_term(pid: int) -> bool:
    from container_entry.common.workers import catches

    return catches(pid, signal.SIGTERM)
