"""torchrun started before the launch (torchrun_process.Prestarted), on real processes.

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

from container_entry.supervise.torchrun_process import Prestarted

ARGV_HEAD = [sys.executable, "-m", "torch.distributed.run"]


def fake_launcher(root: Path, import_seconds: float = 0.0, broken: bool = False) -> Path:
    """A `torch.distributed.run` whose import takes `import_seconds` (or raises) and whose
    main() writes what it got to $RECORD."""
    package = root / "fake" / "torch" / "distributed"
    package.mkdir(parents=True)
    (root / "fake" / "torch" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "run.py").write_text(
        "import json, os, sys, time\n"
        f"time.sleep({import_seconds})\n"
        + ("raise ImportError('planted: torch is broken in this image')\n" if broken else "")
        + "IMPORTED_WITH = list(sys.path)\n"
        "def main(args=None):\n"
        "    with open(os.environ['RECORD'], 'w') as handle:\n"
        "        json.dump({'args': args, 'argv0': sys.argv[0], 'cwd': os.getcwd(),\n"
        "                   'env': dict(os.environ), 'path0': sys.path[0],\n"
        "                   'imported_with': IMPORTED_WITH}, handle)\n"
    )
    return root / "fake"


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


@pytest.mark.parametrize("import_seconds", [0.0, 8.0])
def test_no_launch_ends_it_whether_or_not_its_import_finished(tmp_path, import_seconds):
    prestarted = start(fake_launcher(tmp_path, import_seconds=import_seconds))
    process = prestarted.process
    assert process is not None
    time.sleep(0.5)
    began = time.monotonic()
    prestarted.discard()
    assert time.monotonic() - began < 4.0  # never waits for an import to finish (8 s)
    assert process.returncode in (0, -9)  # 0: it saw EOF itself; -9: killed while importing
    assert gone(process.pid)


def test_it_ends_by_itself_when_the_bootstrap_is_gone(tmp_path):
    """A bootstrap killed with SIGKILL closes its end of the pipe: the interpreter sees EOF
    once imported and exits, instead of waiting for a launch forever."""
    fake = fake_launcher(tmp_path, import_seconds=0.2)
    env = {"PYTHONPATH": str(fake), "PATH": os.environ["PATH"]}
    script = (
        "import os, sys, time\n"
        "from container_entry.supervise.torchrun_process import Prestarted\n"
        f"p = Prestarted(sys.executable, {env!r})\n"
        "print(p.process.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    bootstrap = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid = int(bootstrap.stdout.readline())
    bootstrap.kill()
    bootstrap.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":  # exited; its parent is gone, init reaps it
            break
        time.sleep(0.05)
    else:
        assert not Path(f"/proc/{pid}").exists(), "the interpreter outlived its bootstrap"


def test_a_launcher_that_cannot_be_imported_fails_the_launch_with_its_reason(tmp_path):
    prestarted = start(fake_launcher(tmp_path, broken=True))
    env = {"PATH": os.environ["PATH"], "RECORD": str(tmp_path / "never.json")}
    began = time.monotonic()
    process = prestarted.launch([*ARGV_HEAD, "--nnodes", "1"], env, str(tmp_path))
    assert time.monotonic() - began < 2.0  # the hand-over never blocks the bootstrap
    assert process.wait(timeout=30) == 1
    assert "planted: torch is broken in this image" in process.stderr.read().decode()
    assert not (tmp_path / "never.json").exists()


def test_a_hand_over_bigger_than_a_pipe_does_not_block_while_the_import_runs(tmp_path):
    fake = fake_launcher(tmp_path, import_seconds=4.0)
    prestarted = start(fake)
    record = tmp_path / "record.json"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(fake), "RECORD": str(record)}
    env |= {f"SM_HP_{i}": "x" * 1000 for i in range(300)}  # 300 KB, a pipe holds 64 KiB
    began = time.monotonic()
    process = prestarted.launch([*ARGV_HEAD, "--standalone"], env, str(tmp_path))
    assert time.monotonic() - began < 2.0  # not the 4 s import
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
