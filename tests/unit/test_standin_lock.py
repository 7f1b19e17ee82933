"""The stand-in's lock (scripts/build/standin_lock.py, docker/standin/constraints.txt): every wheel
pinned, so a fresh clone resolves the very wheels, and so the very image, another checkout
built. Stop 33's pre-stop clone got idna 3.21 where the checkout had 3.20, and rebuilt the
8 GB stand-in."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from scripts.build.standin_lock import (
    LOCK,
    LockError,
    canonical_name,
    canonical_version,
    read_lock,
    unpinned,
    wheel_pin,
)
from tests.script_modules import REPO, run_script_module

REQUIREMENTS = REPO / "docker" / "standin" / "requirements.txt"


def _lock(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "constraints.txt"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("filename", "pin"),
    [
        ("idna-3.21-py3-none-any.whl", ("idna", "3.21")),
        ("huggingface_hub-1.10.0-py3-none-any.whl", ("huggingface-hub", "1.10.0")),
        ("zope.interface-8.7-cp312-cp312-manylinux_2_17_x86_64.whl", ("zope-interface", "8.7")),
        ("PyYAML-6.0.4-cp312-cp312-manylinux2014_x86_64.whl", ("pyyaml", "6.0.4")),
        ("python_dateutil-2.9.0.post0-py2.py3-none-any.whl", ("python-dateutil", "2.9.0.post0")),
        ("certifi-2026.10.19.post1-py3-none-any.whl", ("certifi", "2026.10.19.post1")),
        ("torch-2.9.0+cpu-cp312-cp312-linux_x86_64.whl", ("torch", "2.9.0+cpu")),
        (
            "sagemaker_training-5.1.4-1-cp312-cp312-linux_x86_64.whl",
            ("sagemaker-training", "5.1.4"),
        ),
    ],
)
def test_a_wheel_names_its_project_and_version_canonically(filename, pin):
    assert wheel_pin(filename) == pin


@pytest.mark.parametrize(
    "filename",
    ["idna.tar.gz", "idna-3.21.whl", "idna-3.21-py3-any.whl", "-3.21-py3-none-any.whl", ".whl"],
)
def test_what_is_not_a_wheel_name_is_an_error_that_names_it(filename):
    with pytest.raises(LockError, match=re.escape(repr(filename))):
        wheel_pin(filename)


def test_names_and_versions_compare_as_pip_compares_them():
    assert {canonical_name(n) for n in ("Foo_Bar", "foo-bar", "foo.bar", "FOO__bar")} == {"foo-bar"}
    assert {canonical_version(v) for v in ("1.0", "1.0.0", "1", "v1.0", "01.00")} == {"1"}
    assert canonical_version("1.10") != canonical_version("1.1")
    assert canonical_version("1.0rc1") != canonical_version("1.0")
    assert canonical_version("2.9.0.post0") == "2.9.post0"


def test_every_wheel_must_be_pinned_at_its_version(tmp_path):
    pins = read_lock(_lock(tmp_path, "idna==3.21\nFoo_Bar==1.0\n"))
    assert unpinned(["idna-3.21-py3-none-any.whl", "foo.bar-1.0.0-py3-none-any.whl"], pins) == []
    assert unpinned(["idna-3.20-py3-none-any.whl"], pins) == ["idna 3.20 (lock: 3.21)"]
    assert unpinned(["six-1.17.0-py3-none-any.whl"], pins) == ["six 1.17.0 (not in lock)"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("idna>=3.20\n", ":1: not a `name==version` pin: 'idna>=3.20'"),
        ("# ok\n\nidna\n", ":3: not a `name==version` pin: 'idna'"),
        ("idna==3.21\nIDNA==3.20\n", ":2: IDNA is pinned twice"),
        ("idna==3.21 ; python_version<'3'\n", ":1: not a `name==version` pin"),
    ],
)
def test_a_lock_line_that_is_not_one_pin_is_an_error_naming_its_line(tmp_path, text, problem):
    path = _lock(tmp_path, text)
    with pytest.raises(LockError, match=re.escape(f"{path}{problem}")):
        read_lock(path)


def test_comments_repeats_and_the_arbitrary_equality_form_are_read(tmp_path):
    text = "# header\n  idna == 3.21  # why\nidna==3.21.0\nsix===1.17.0\n"
    assert read_lock(_lock(tmp_path, text)) == {"idna": "3.21", "six": "1.17.0"}


def test_an_unreadable_lock_is_one_error_naming_it(tmp_path):
    path = tmp_path / "constraints.txt"
    path.write_bytes(b"idna==3.21\n\xff\xfe\n")
    with pytest.raises(LockError, match=re.escape(f"{path}: cannot read the lock")):
        read_lock(path)
    with pytest.raises(LockError, match="cannot read the lock"):
        read_lock(tmp_path / "absent.txt")


def _cli(*args: str) -> subprocess.CompletedProcess:
    """As scripts/build/build-standin.sh runs it: a module from the repository root."""
    return run_script_module("build.standin_lock", *args)


def test_the_check_passes_what_write_wrote_and_stops_a_drifted_wheel_in_one_line(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("idna-3.20-py3-none-any.whl", "torch-2.9.0-cp312-cp312-linux_x86_64.whl"):
        (wheels / name).touch()
    lock = tmp_path / "lock.txt"
    assert _cli("write", "--wheels", str(wheels), "--lock", str(lock)).returncode == 0
    assert "idna==3.20\ntorch==2.9.0\n" in lock.read_text()  # as the wheels name them
    assert read_lock(lock) == {"idna": "3.20", "torch": "2.9.0"}
    done = _cli("check", "--wheels", str(wheels), "--lock", str(lock))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    (wheels / "idna-3.20-py3-none-any.whl").rename(wheels / "idna-3.21-py3-none-any.whl")
    (wheels / "six-1.17.0-py2.py3-none-any.whl").touch()
    done = _cli("check", "--wheels", str(wheels), "--lock", str(lock))
    assert done.returncode == 1
    assert done.stderr == (
        f"[standin-lock] 2 wheel(s) in {wheels} not pinned in {lock}: "
        "idna 3.21 (lock: 3.20), six 1.17.0 (not in lock)\n"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _cli("check", "--wheels", str(empty), "--lock", str(lock))
    assert (done.returncode, done.stderr) == (1, f"[standin-lock] {empty}: no wheels to check\n")


def test_the_lock_holds_every_pin_of_the_dlc_at_the_same_version():
    """requirements.txt says which pins are the DLC's; the lock must not contradict them
    (pip would refuse the pair) nor leave one out."""
    pins = read_lock(LOCK)
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, op, version = re.match(r"([A-Za-z0-9._-]+)\s*(==|<|>=)?\s*([^,\s]*)", line).groups()
        assert canonical_name(name) in pins, f"{name} is in requirements.txt, not in the lock"
        if op == "==":
            assert canonical_version(pins[canonical_name(name)]) == canonical_version(version), line
