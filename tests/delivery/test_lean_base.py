"""The image builds on any base whose Python has pip: no setuptools or `wheel` needed, no
network, and the base's own packages stay as they were."""

from __future__ import annotations

import subprocess


def pip_list(image: str) -> dict[str, str]:
    listed = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image,
         "-m", "pip", "list", "--format", "freeze", "--disable-pip-version-check"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return dict(line.split("==", 1) for line in listed.splitlines() if "==" in line)


def test_a_base_with_old_setuptools_and_no_wheel_builds_and_is_left_as_it_was(
    lean_base, lean_image
):
    before, after = pip_list(lean_base), pip_list(lean_image)
    assert "wheel" not in before and int(before["setuptools"].split(".")[0]) < 70
    assert {k: v for k, v in after.items() if k != "container-entry"} == before
    assert "container-entry" in after
    shown = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", lean_image, "--help"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert shown.returncode == 0 and shown.stdout.startswith("usage: container-entry")
