"""torchrun started before the launch (prestart.Prestarted), on real processes, and what it
starts with: the user's environment, before the plan exists (the cli starts it first thing).

The launcher here is a stand-in `torch.distributed.run` module on PYTHONPATH (no torch needed:
what is tested is the hand-over, not torchrun): its import is the slow part a real torchrun has,
its `main(args)` records what it was handed. Every way the interpreter can end is covered: a
launch, no launch (the bootstrap failed or was stopped), the bootstrap gone, a launcher that
cannot be imported, a hand-over bigger than a pipe holds while the import still runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from container_entry.supervise import _torchrun_main
from container_entry.supervise.prestart import Prestarted, added_path, start_environment

ARGV_HEAD = [sys.executable, "-m", "torch.distributed.run"]


def fake_launcher(root: Path, import_seconds: float = 0.0, broken: bool = False) -> Path:
    """A `torch.distributed.run` whose import takes `import_seconds` (then touches
    `imported(root)`; or raises) and whose main() writes what it got to $RECORD."""
    package = root / "fake" / "torch" / "distributed"
    package.mkdir(parents=True)
    (root / "fake" / "torch" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "run.py").write_text(
        "import json, os, sys, time\n"
        f"time.sleep({import_seconds})\n"
        f"open({str(imported(root))!r}, 'w').close()\n"
        + ("raise ImportError('planted: torch is broken in this image')\n" if broken else "")
        + "IMPORTED_WITH = list(sys.path)\n"
        "IMPORT_SAW = {'blas': os.environ.get('OPENBLAS_NUM_THREADS')}\n"
        "def main(args=None):\n"
        "    with open(os.environ['RECORD'], 'w') as handle:\n"
        "        json.dump({'args': args, 'argv0': sys.argv[0], 'cwd': os.getcwd(),\n"
        "                   'env': dict(os.environ), 'path0': sys.path[0], 'path': sys.path,\n"
        "                   'pid': os.getpid(), 'import_saw': IMPORT_SAW,\n"
        "                   'imported_with': IMPORTED_WITH}, handle)\n"
        "if __name__ == '__main__':  # started plainly, as `python -m torch.distributed.run`\n"
        "    main(sys.argv[1:])\n"
    )
    return root / "fake"


def imported(root: Path) -> Path:
    """Touched by the stand-in launcher once its import is done: a test tells "launch (or
    discard) returned before the import ended" by the event, not by a bound on its own wall
    time, which a stall of the test process alone can exceed."""
    return root / "imported"


def start(fake: Path, **extra: str) -> Prestarted:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(fake), **extra}
    return Prestarted(sys.executable, env)


def gone(pid: int) -> bool:
    """Exited and reaped (no zombie left behind)."""
    return not Path(f"/proc/{pid}").exists()


def test_the_launch_runs_exactly_the_handed_command_line_environment_and_folder(tmp_path):
    fake = fake_launcher(tmp_path, import_seconds=0.3)
    code = tmp_path / "code"  # created only after the interpreter started (code fetched late)
    prestarted = start(fake, ONLY_AT_START="1")
    code.mkdir()
    record = tmp_path / "record.json"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(fake), "RECORD": str(record)}
    env["ODD"] = "--log $(id) \"q\" 'x' ünï\tcode"  # handed as data, never through a shell
    args = ["--nnodes", "2", "--node-rank", "1", "-m", "container_entry.worker"]
    ready = tmp_path / "torchrun.ready"  # its import done, the launch came: no silence of ours
    process = prestarted.launch([*ARGV_HEAD, *args], env, str(code), str(ready))
    assert process.wait(timeout=30) == 0, process.stderr.read().decode()
    assert ready.exists() and ready.stat().st_mtime <= record.stat().st_mtime
    got = json.loads(record.read_text())
    assert got["args"] == args
    assert Path(got["argv0"]).name == "run.py"  # argparse's prog, as `-m` gives it
    assert got["cwd"] == str(code)
    assert got["path0"] == str(code)  # as `python -m` puts the working folder first
    assert "" not in got["imported_with"]  # nothing imported from the bootstrap's own folder
    shown = {k: v for k, v in got["env"].items() if k not in ("PWD", "LC_CTYPE")}
    assert shown == env  # the final environment replaces the one it started with
    prestarted.discard()  # after a launch: nothing to end
    assert process.poll() == 0


@pytest.mark.parametrize("users", [None, "3", ""])
def test_the_launcher_imports_with_one_blas_thread_and_runs_as_it_was(tmp_path, users):
    """_torchrun_main.import_launcher: what torch's import sees (OpenBLAS on one thread unless
    the user chose), and what the launch sees (its environment)."""
    fake = fake_launcher(tmp_path)
    given = {} if users is None else {"OPENBLAS_NUM_THREADS": users}
    prestarted = start(fake, **given)
    record = tmp_path / "record.json"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(fake), "RECORD": str(record), **given}
    process = prestarted.launch([*ARGV_HEAD, "--standalone"], env, str(tmp_path))
    assert process.wait(timeout=30) == 0, process.stderr.read().decode()
    got = json.loads(record.read_text())
    assert got["import_saw"] == {"blas": "1" if users is None else users}
    assert got["env"].get("OPENBLAS_NUM_THREADS") == given.get("OPENBLAS_NUM_THREADS")


def test_torchs_import_in_the_launcher_starts_no_blas_thread():
    """Real torch: numpy's OpenBLAS starts a thread per CPU it is told of (OMP_NUM_THREADS=4
    here, so the count does not depend on this machine's CPUs); the launcher's import starts
    none and leaves the variable as it found it."""
    main = Path(_torchrun_main.__file__)
    probe = (
        "import os, runpy, sys\n"
        f"launcher = runpy.run_path({str(main)!r}, run_name='m')['import_launcher']\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "launcher() if sys.argv[1] == 'ours' else __import__('torch.distributed.run')\n"
        "print(len(os.listdir('/proc/self/task')) - before, "
        "os.environ.get('OPENBLAS_NUM_THREADS'))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "4"}
    env.pop("OPENBLAS_NUM_THREADS", None)
    started = {}
    for how in ("plain", "ours"):
        out = subprocess.run(
            [sys.executable, "-c", probe, how], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        started[how] = out.stdout.split()
    assert started["plain"][0] != "0", started  # the check can tell: numpy's OpenBLAS is there
    assert started["ours"] == ["0", "None"], started


@pytest.mark.parametrize("import_seconds", [0.0, 8.0])
def test_no_launch_ends_it_whether_or_not_its_import_finished(tmp_path, import_seconds):
    prestarted = start(fake_launcher(tmp_path, import_seconds=import_seconds))
    process = prestarted.process
    assert process is not None
    time.sleep(0.5)
    began = time.monotonic()
    prestarted.discard()
    # never waits for an import to finish: told by the event (the 8-s import never ended, it
    # was killed in it); the bound only catches a discard that hangs, far above the ~1 ms it
    # takes (a stall of this process alone takes seconds)
    assert time.monotonic() - began < 10.0
    if import_seconds:
        assert not imported(tmp_path).exists() and process.returncode == -9
    assert process.returncode in (0, -9)  # 0: it saw EOF itself; -9: killed while importing
    assert gone(process.pid)


def test_it_ends_by_itself_when_the_bootstrap_is_gone(tmp_path):
    """A bootstrap killed with SIGKILL closes its end of the pipe: the interpreter sees EOF
    once imported and exits, instead of waiting for a launch forever."""
    fake = fake_launcher(tmp_path, import_seconds=0.2)
    env = {"PYTHONPATH": str(fake), "PATH": os.environ["PATH"]}
    script = (
        "import os, sys, time\n"
        "from container_entry.supervise.prestart import Prestarted\n"
        f"p = Prestarted(sys.executable, {env!r})\n"
        "print(p.process.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    bootstrap = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid = int(bootstrap.stdout.readline())
    bootstrap.kill()
    bootstrap.wait()
    # it exits at once once imported (~0.5 s); 30 s: what a loaded machine's Python start and
    # stalls never reach, and still no "waiting forever"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":  # exited; its parent is gone, init reaps it
            break
        time.sleep(0.05)
    else:
        assert not Path(f"/proc/{pid}").exists(), "the interpreter outlived its bootstrap"


def test_a_launcher_that_cannot_be_imported_fails_the_launch_with_its_reason(tmp_path):
    fake = fake_launcher(tmp_path, broken=True)
    prestarted = start(fake)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(fake),
        "RECORD": str(tmp_path / "never.json"),
    }
    began = time.monotonic()
    process = prestarted.launch([*ARGV_HEAD, "--nnodes", "1"], env, str(tmp_path))
    # the hand-over never blocks the bootstrap (it takes ~1 ms): 10 s, far above what a stall
    # of this process alone takes (the test below tells a launch that waits by the event)
    assert time.monotonic() - began < 10.0
    assert process.wait(timeout=30) == 1
    assert "planted: torch is broken in this image" in process.stderr.read().decode()
    assert not (tmp_path / "never.json").exists()


def test_a_hand_over_bigger_than_a_pipe_does_not_block_while_the_import_runs(tmp_path):
    # 6 s: what a stall of this process between the interpreter's start and the check below
    # does not outlast (the check is the event, not launch's own wall time)
    fake = fake_launcher(tmp_path, import_seconds=6.0)
    prestarted = start(fake)
    record = tmp_path / "record.json"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(fake), "RECORD": str(record)}
    env |= {f"SM_HP_{i}": "x" * 1000 for i in range(300)}  # 300 KB, a pipe holds 64 KiB
    process = prestarted.launch([*ARGV_HEAD, "--standalone"], env, str(tmp_path))
    # returned while the import still ran (a blocking write returns only once it read the pipe)
    assert not imported(tmp_path).exists()
    assert process.wait(timeout=30) == 0
    assert json.loads(record.read_text())["env"]["SM_HP_299"] == "x" * 1000


def test_a_command_line_of_another_shape_runs_as_given(tmp_path):
    """Only `PYTHON -m torch.distributed.run ...` is handed over; anything else (and a Python
    that could not be started) runs as a plain process, as before there was a pre-start."""
    prestarted = Prestarted("/no/such/python", {})
    assert prestarted.process is None
    marker = tmp_path / "ran"
    process = prestarted.launch(
        [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], {"PATH": os.environ["PATH"]}, "/"
    )
    assert process.wait(timeout=30) == 0 and marker.exists()


def venv_with_launcher(root: Path) -> str:
    """A Python whose site folder holds the stand-in launcher: importable with no PYTHONPATH,
    as torch is in the image."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    fake = fake_launcher(root)
    (fake / "torch").rename(Path(site) / "torch")
    return str(python)


def as_python_starts_it(python: str, env: dict[str, str], cwd: Path) -> dict:
    """What plain `python -m torch.distributed.run` records with that environment and folder."""
    record = cwd.parent / "plain.json"
    env = dict(env, RECORD=str(record))
    subprocess.run([python, "-m", "torch.distributed.run", "--x"], env=env, cwd=cwd, check=True)
    return json.loads(record.read_text())


@pytest.mark.parametrize("entries", [1, 2])
def test_a_code_folder_the_plan_adds_to_pythonpath_is_where_python_puts_it(tmp_path, entries):
    """The cli starts the interpreter before the plan, with the user's environment (no
    PYTHONPATH); the plan then adds PYTHONPATH=<code folder>: torchrun's sys.path must be
    exactly the one Python's own start would have made with it (after the working folder,
    before the standard library and the site folders)."""
    python = venv_with_launcher(tmp_path)
    folders = [tmp_path / f"code{i}" for i in range(entries)]
    for folder in folders:
        folder.mkdir()
    start = start_environment({"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    prestarted = Prestarted(python, start)
    final = dict(start, PYTHONPATH=os.pathsep.join(map(str, folders)), OMP_NUM_THREADS="2")
    final["RECORD"] = str(tmp_path / "record.json")
    process = prestarted.launch(
        [python, "-m", "torch.distributed.run", "--x"], final, str(folders[0])
    )
    assert process.pid == prestarted.process.pid  # handed over, not started again
    assert process.wait(timeout=30) == 0, process.stderr.read().decode()
    got = json.loads(Path(final["RECORD"]).read_text())
    want = as_python_starts_it(python, final, folders[0])
    assert got["path"] == want["path"]
    assert got["path"][1 : 1 + entries] == list(map(str, folders))


START_CASES = {
    # name: (the user's environment, the final one beyond PATH and PYTHONUNBUFFERED=1, the
    # sys.path entries the launch adds; None: a fresh torchrun instead)
    "the same": ({}, {}, []),
    "a variable read later (OMP, NCCL, SM_*)": ({}, {"OMP_NUM_THREADS": "2", "SM_HPS": "{}"}, []),
    "PYTHONPATH added, absolute": ({}, {"PYTHONPATH": "/opt/ml/code"}, ["/opt/ml/code"]),
    "PYTHONPATH added, two": ({}, {"PYTHONPATH": "/a:/b"}, ["/a", "/b"]),
    "PYTHONPATH the user's, kept": ({"PYTHONPATH": "/u"}, {"PYTHONPATH": "/u"}, []),
    "PYTHONPATH the user's, changed": ({"PYTHONPATH": "/u"}, {"PYTHONPATH": "/c"}, None),
    "PYTHONPATH added, relative": ({}, {"PYTHONPATH": "code"}, None),
    "PYTHONPATH added, empty entry": ({}, {"PYTHONPATH": "/a::/b"}, None),
    "PYTHONPATH added, empty": ({}, {"PYTHONPATH": ""}, None),
    "PYTHONPATH removed": ({"PYTHONPATH": "/u"}, {}, None),
    "PYTHONHASHSEED added": ({}, {"PYTHONHASHSEED": "0"}, None),
    "PYTHONSAFEPATH added": ({}, {"PYTHONSAFEPATH": "1"}, None),
    "PYTHONUNBUFFERED changed": ({}, {"PYTHONUNBUFFERED": "0"}, None),
    "LD_PRELOAD added": ({}, {"LD_PRELOAD": "/x.so"}, None),
    "LD_LIBRARY_PATH removed": ({"LD_LIBRARY_PATH": "/l"}, {}, None),
    "PYTHONPATH added and LD_PRELOAD": ({}, {"PYTHONPATH": "/a", "LD_PRELOAD": "/x.so"}, None),
}


@pytest.mark.parametrize("case", START_CASES, ids=list(START_CASES))
def test_what_an_interpreter_reads_at_its_start_decides_whether_it_can_be_handed_over(case):
    """The final environment as child_environment makes it: the user's plus the plan's."""
    started, added, want = START_CASES[case]
    start = start_environment({"PATH": "/bin", **started})
    final = {"PATH": "/bin", "PYTHONUNBUFFERED": "1", **added}
    assert added_path(start, final) == want


def test_the_start_environment_is_the_users_and_unbuffered_unless_they_said_otherwise():
    assert start_environment({"A": "1"}) == {"A": "1", "PYTHONUNBUFFERED": "1"}
    assert start_environment({"PYTHONUNBUFFERED": "0"}) == {"PYTHONUNBUFFERED": "0"}


@pytest.mark.parametrize("case", ["LD_PRELOAD", "another Python"])
def test_an_interpreter_that_cannot_become_the_launch_is_ended_and_a_fresh_one_runs(tmp_path, case):
    fake = fake_launcher(tmp_path, import_seconds=0.2)
    prestarted = start(fake)
    early = prestarted.process
    record = tmp_path / "record.json"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(fake), "RECORD": str(record)}
    python = sys.executable
    if case == "LD_PRELOAD":
        env["LD_PRELOAD"] = ""  # empty: loads nothing, but read at the start all the same
    else:
        python = str(Path(sys.executable).resolve())  # the same binary, by another name
        assert python != sys.executable
    process = prestarted.launch([python, "-m", "torch.distributed.run", "--y"], env, str(tmp_path))
    assert process is not early and gone(early.pid)
    assert process.wait(timeout=30) == 0
    got = json.loads(record.read_text())
    assert got["args"] == ["--y"] and got["env"].get("LD_PRELOAD") == env.get("LD_PRELOAD")
