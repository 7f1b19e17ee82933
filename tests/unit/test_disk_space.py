"""The free-disk check before a build (scripts/build/disk_space.py), on this machine's real
disks."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from scripts.build.disk_space import (
    AFTER,
    GIB,
    TARGETS,
    Need,
    Standin,
    existing,
    need,
    shortfall,
    standin_state,
)
from tests.script_modules import run_script_module


def _free(path: Path) -> float:
    return shutil.disk_usage(path).free / GIB


def _disk_space(*args: str) -> subprocess.CompletedProcess:
    """The check as make runs it, from the repository root."""
    return run_script_module("build.disk_space", *args)


def test_too_little_room_is_one_line_with_what_is_needed_and_free_and_exit_1(tmp_path):
    result = _disk_space(
        *("--for", "demo", "--need-gib", "1000000"),
        *("--repo", str(tmp_path), "--docker-root", str(tmp_path / "not" / "yet")),
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "[disk] make demo needs about 2000000 GiB free on the filesystem of "
    )
    assert " GiB is free" in lines[0] and str(tmp_path) in lines[0]


def test_enough_room_says_nothing_and_exits_0(tmp_path):
    result = _disk_space("--need-gib", "0", "--repo", str(tmp_path), "--docker-root", str(tmp_path))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_two_folders_on_one_filesystem_need_the_sum_there(tmp_path):
    share = _free(tmp_path) * 0.6  # each fits alone, both together do not
    problem = shortfall("test", Need(repo=share, docker=share), tmp_path, tmp_path / "docker")
    assert problem is not None and f"needs about {2 * share:.0f} GiB" in problem


def test_folders_on_two_filesystems_each_need_their_own_share(tmp_path):
    other = Path("/dev/shm")  # tmpfs: another filesystem than the test's tmp folder
    assert existing(other).stat().st_dev != tmp_path.stat().st_dev
    need = Need(repo=_free(tmp_path) * 0.6, docker=_free(other) * 0.6)
    assert shortfall("test", need, tmp_path, other) is None
    need = Need(repo=_free(tmp_path) * 0.6, docker=_free(other) * 2)
    problem = shortfall("test", need, tmp_path, other)
    assert problem is not None and "/dev/shm" in problem and str(tmp_path) not in problem


def test_without_its_smoke_record_the_stand_in_is_never_counted_as_built_here(tmp_path):
    """A checkout with no build/logs/smoke.ok (a fresh clone) or one that cannot be read
    stages the wheels again; an image that does not exist is built (the docker tests check
    the side where the image exists)."""
    missing = "container-entry/no-such-image:none"
    assert standin_state(tmp_path, missing) is Standin.ABSENT
    (tmp_path / "build" / "logs" / "smoke.ok").mkdir(parents=True)  # a folder: unreadable
    assert standin_state(tmp_path, missing) is Standin.ABSENT


def _total(wanted: Need) -> float:
    return wanted.repo + wanted.docker


def test_a_run_needs_what_it_still_has_to_build_and_no_more():
    """Stop 33's CI: a fresh clone beside the up-to-date stand-in image was asked for the
    whole build (26 GiB) with 19.7 GiB free, where it needed the wheels staged again and its
    own images; it failed before running a test."""
    for target in AFTER:
        here, image_only, absent = (need(target, state) for state in Standin)
        assert _total(here) < _total(image_only) < _total(absent), target
        assert image_only.docker == here.docker, target  # no image build counted
        assert image_only.repo - here.repo >= 4, target  # 4.1 GB of wheels and the Python tree
        assert absent.docker - here.docker >= 20, target  # a 12 GB stage beside an 8 GB image
    assert _total(need("test", Standin.IMAGE_ONLY)) < 19.7  # what stop 33's CI had free
    # the build's own check (scripts/build/build-standin.sh, just before docker build) asks for
    # the build's peak whatever state it started from
    assert {need("standin-image", state) for state in Standin} == {Need(repo=0, docker=20)}
    assert set(TARGETS) == {*AFTER, "standin-image"}


def test_the_stand_in_builds_own_line_names_the_build_not_a_make_target(tmp_path):
    result = _disk_space(
        *("--for", "standin-image", "--need-gib", "1000000"),
        *("--repo", str(tmp_path), "--docker-root", str(tmp_path)),
    )
    assert result.returncode == 1
    assert result.stderr.startswith("[disk] the stand-in's docker build needs about 2000000 GiB")
    assert len(result.stderr.splitlines()) == 1, result.stderr
