"""The image's bash hook for SDK v3's own start, and the SDK's start run as it is.

The hook is the image's own: BASH_ENV's value is read from docker/Dockerfile and points at
docker/sdk-hook.bash; PID 1 is a real one, in a PID namespace of its own (`unshare`, root, as
CI runs). `container-entry sagemaker-sdk` runs the real bootstrap (this venv's Python).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from container_entry.plan import sdk_driver
from tests.integration.conftest import REPO
from tests.ports import this_test_port

HOOK = REPO / "docker" / "sdk-hook.bash"
IMAGE_HOOK = "/etc/container-entry/pid"  # + "1": the hook; + any other pid: no such file
START = sdk_driver.sdk_start(Path("/opt/ml"))


@pytest.fixture
def bash_env(tmp_path) -> str:
    """BASH_ENV as the image sets it (docker/Dockerfile), its folder here a copy of the
    image's: this checkout's hook as `pid1`."""
    text = (REPO / "docker" / "Dockerfile").read_text()
    value = re.search(r'^ENV BASH_ENV="(.*)"$', text, re.M)
    assert value, "docker/Dockerfile sets BASH_ENV"
    assert IMAGE_HOOK in value.group(1)
    assert f"docker/sdk-hook.bash {IMAGE_HOOK}1" in text  # installed under that name
    folder = tmp_path / "etc-container-entry"
    folder.mkdir()
    shutil.copy(HOOK, folder / "pid1")
    return value.group(1).replace("\\$", "$").replace(IMAGE_HOOK, f"{folder}/pid")


@pytest.fixture
def fake_bin(tmp_path) -> Path:
    """A `container-entry` that only records how it was called, first on PATH."""
    folder = tmp_path / "bin"
    folder.mkdir()
    record = tmp_path / "called"
    (folder / "container-entry").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\necho handed-over\n'
    )
    (folder / "container-entry").chmod(0o755)
    return folder


def shell(
    argv: list[str], path: str, pid1: bool, cwd: Path, bash_env: str
) -> subprocess.CompletedProcess:
    if pid1:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.fail("the hook's PID 1 tests need root and unshare (CI runs as root)")
        argv = ["unshare", "--fork", "--pid", "--mount-proc", *argv]
    env = {"PATH": path, "BASH_ENV": bash_env, "HOME": str(cwd)}
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


# (name, argv, PID 1, handed over)
CASES = [
    ("the SDK's start as PID 1", ["/bin/bash", "-c", START], True, True),
    ("any PID 1 bash -c naming the drivers", ["bash", "-c", "echo sm_drivers"], True, True),
    ("the SDK's start, not PID 1", ["/bin/bash", "-c", START], False, False),
    ("another command as PID 1", ["bash", "-c", "echo plain"], True, False),
    ("PID 1 with -eu", ["bash", "-euc", "echo plain"], True, False),
    ("a bash script as PID 1", ["bash", "SCRIPT"], True, False),
    ("sh -c as PID 1", ["sh", "-c", START], True, False),
    ("bash --posix as PID 1", ["bash", "--posix", "-c", START], True, False),
]


@pytest.mark.parametrize(
    ("argv", "pid1", "handed"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_only_pid1_bash_running_the_sdk_start_is_handed_over(
    argv, pid1, handed, fake_bin, tmp_path, bash_env
):
    script = tmp_path / "script.sh"
    script.write_text(f"echo from-script\n{START}\n")
    argv = [str(script) if a == "SCRIPT" else a for a in argv]
    result = shell(argv, f"{fake_bin}:/usr/bin:/bin", pid1, tmp_path, bash_env)
    called = tmp_path / "called"
    assert called.exists() is handed, result.stderr
    if handed:
        shell_argv = argv if argv[0].startswith("/") else [argv[0], *argv[1:]]
        assert called.read_text().splitlines() == ["sagemaker-sdk", "", *shell_argv]
        assert result.stdout == "handed-over\n" and result.returncode == 0
    else:
        assert "handed-over" not in result.stdout
        assert "[container-entry]" not in result.stderr


def test_a_command_that_is_not_the_sdk_start_prints_exactly_what_it_prints(
    fake_bin, tmp_path, bash_env
):
    argv = ["bash", "-c", "printf 'a b\\n'; echo err >&2; exit 3"]
    hooked = shell(argv, f"{fake_bin}:/usr/bin:/bin", True, tmp_path, bash_env)
    plain = shell(argv, "/usr/bin:/bin", True, tmp_path, "")
    assert (hooked.stdout, hooked.stderr, hooked.returncode) == ("a b\n", "err\n", 3)
    assert (plain.stdout, plain.stderr, plain.returncode) == ("a b\n", "err\n", 3)


def test_without_container_entry_on_path_the_sdk_start_runs_and_says_so(tmp_path, bash_env):
    result = shell(["/bin/bash", "-c", START], "/usr/bin:/bin", True, tmp_path, bash_env)
    lines = [line for line in result.stderr.splitlines() if "[container-entry]" in line]
    assert lines == [
        "[container-entry] container-entry is not on PATH: the SageMaker SDK's own start runs, "
        "without container-entry's launcher"
    ]
    assert "sm_train.sh" in result.stderr  # then bash ran the SDK's start itself (chmod fails)
    assert result.returncode != 0


# --- `container-entry sagemaker-sdk`: the SDK's start run as it is, under our PID 1 ---


def sdk_command(tmp_path: Path, string: str, stopped: str = "", **env: str) -> subprocess.Popen:
    base = tmp_path / "ml"
    (base / "output").mkdir(parents=True, exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CONTAINER_ENTRY_", "SM_"))}
    environ.update(SAGEMAKER_BASE_DIR=str(base), **env)
    argv = [sys.executable, "-m", "container_entry", "sagemaker-sdk", stopped, "/bin/bash", "-c"]
    return subprocess.Popen(
        [*argv, string],
        env=environ,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_an_unknown_layout_runs_the_command_as_it_is_and_says_why(tmp_path):
    process = sdk_command(tmp_path, "echo sm_drivers-probe; echo to-stderr >&2; exit 7")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 7
    assert out == "sm_drivers-probe\n"
    said = [line for line in err.splitlines() if line.startswith("[container-entry]")]
    assert len(said) == 1 and "layout not recognised" in said[0], err
    assert "the SDK's own start runs" in said[0] and "to-stderr" in err


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


# the SDK's start: bash runs a Python that checkpoints for 2 s on SIGTERM (bash itself dies of
# the signal at once, so the checkpoint's process is orphaned mid-save)
CHECKPOINTING = """\
import os, signal, sys, time
def save(signum, frame):
    time.sleep(2)
    open(sys.argv[1] + "/saved", "w").write("ok")
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
open(sys.argv[1] + "/ready", "w").close()
while True:
    time.sleep(0.1)
"""


def test_a_stop_reaches_every_process_of_the_sdk_start_and_waits_for_its_checkpoint(tmp_path):
    (tmp_path / "train.py").write_text(CHECKPOINTING)
    process = sdk_command(tmp_path, f"{sys.executable} {tmp_path}/train.py {tmp_path}; echo after")
    wait_for(tmp_path / "ready")
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert (tmp_path / "saved").read_text() == "ok"  # waited for the orphaned checkpoint
    assert "after" not in out
    failure = (tmp_path / "ml" / "output" / "failure").read_text()
    assert failure.startswith("StopRequested: job stopped by SIGTERM"), failure


def test_a_start_that_ignores_the_stop_is_killed_after_the_grace(tmp_path):
    ready = tmp_path / "ready"
    string = f"trap '' INT TERM; touch {ready}; sleep 60"
    process = sdk_command(tmp_path, string, CONTAINER_ENTRY_STOP_GRACE_PERIOD="1")
    wait_for(ready)
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert time.monotonic() - started < 10
    assert "still ran 1 s after the stop: killed" in err


@pytest.mark.parametrize("stopped", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_stop_the_hook_noted_ends_the_job_before_the_start_runs(tmp_path, stopped):
    marker = tmp_path / "ran"
    process = sdk_command(tmp_path, f"touch {marker}; echo sm_drivers", stopped)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.Signals[stopped].value, err
    assert not marker.exists()
    failure = (tmp_path / "ml" / "output" / "failure").read_text()
    assert f"stopped by {stopped} before the SDK's start ran" in failure


def test_garbage_from_the_hook_is_not_a_stop(tmp_path):
    process = sdk_command(tmp_path, "exit 0", "SIGKILL")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err


# --- taken over: a fake of the SDK's channel (our own files, the shape sdk_driver reads) ---

FAKE_ENVIRONMENT_PY = """\
import json, os, sys
base = os.environ["SAGEMAKER_BASE_DIR"]
hps = json.load(open(base + "/input/config/hyperparameters.json"))
with open(base + "/input/sm_training.env", "w") as f:
    f.write("export SM_HPS='" + json.dumps(hps) + "'\\n")
    f.write("export SM_ENTRY_SCRIPT='run.sh'\\n")
print("every variable, as the SDK prints them")
"""


def sdk_tree(tmp_path: Path, entry: str, text: str, hyperparameters: str) -> Path:
    base = tmp_path / "ml"
    drivers = base / "input" / "data" / "sm_drivers"
    (drivers / "scripts").mkdir(parents=True)
    (drivers / "scripts" / "environment.py").write_text(FAKE_ENVIRONMENT_PY)
    env_file = base / "input" / "sm_training.env"
    (drivers / "sm_train.sh").write_text(
        f"python3 {drivers}/scripts/environment.py\nsource {env_file}\n"
        f"python3 {drivers}/distributed_drivers/basic_script_driver.py\n"
    )
    (drivers / "sourcecode.json").write_text(
        json.dumps({"source_dir": "src", "entry_script": entry, "requirements": None})
    )
    (drivers / "distributed.json").write_text("{}")
    code = base / "input" / "data" / "code"
    code.mkdir(parents=True)
    (code / entry).write_text(text)
    config = base / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(
        json.dumps({"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"})
    )
    (config / "hyperparameters.json").write_text(hyperparameters)
    (config / "inputdataconfig.json").write_text("{}")
    return base


def test_a_taken_over_sh_entry_without_its_run_line_runs_under_sh_with_the_sdks_arguments(
    tmp_path,
):
    # no '#!' line: the SDK's driver starts it through /bin/sh, which runs it itself
    script = 'echo "SH-RAN $# [$1] [$2] [$3] [$4] $SM_ENTRY_SCRIPT"\n'
    base = sdk_tree(tmp_path, "run.sh", script, '{"zeta": "1", "alpha": "tiny bert"}')
    start = sdk_driver.sdk_start(base)
    process = sdk_command(
        tmp_path,
        start,
        CONTAINER_ENTRY_MASTER_PORT=str(this_test_port()),
        CONTAINER_ENTRY_HOST_WAIT_TIMEOUT="20",
    )
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "SH-RAN 4 [--zeta] [1] [--alpha] [tiny bert] run.sh" in out, out + err
    assert "container-entry's launcher runs it" in err
    assert "every variable" not in out + err  # the SDK's environment printout is not shown
    assert (base / "output" / "success").exists()
