"""Free disk before a build (`make demo`, `make test`, `make standin`): one line and exit 1 at
once, instead of `no space left on device` eight minutes into the stand-in's build.

What the figures come from (this machine, 2026-12-04): building the stand-in from nothing keeps
build/standin (the staged Python and the wheels, 4.1 GB) and the image (8.0 GB), and holds its
first build stage (about 12 GB) until the second is done; the tests' and the demo's images are
layers on the stand-in (tens of MB each), the SDK test venvs 1.0 GB, .venv about 1 GB.

What a run still has to build decides what it needs, so the stand-in's state counts:
- built here (build/logs/smoke.ok names the image): only the run's own few GB;
- the image exists but this checkout has not staged it (a fresh clone beside another
  checkout's image): the 4 GB of wheels again. The lock (docker/standin/constraints.txt)
  gives it the same wheels, so the same image: scripts/build/build-standin.sh reuses it, and checks
  `--for standin-image` itself just before a docker build where the fingerprint differs;
- no image: the whole build as well.
Counting a fresh clone as "no image" asked CI for 26 GiB where it needed 9, and failed it.

    python3 -m scripts.build.disk_space [--for demo|test|standin|standin-image] [--repo DIR]
        [--docker-root DIR]

Stdlib only: it runs before the venv exists.
"""

from __future__ import annotations

import argparse
import enum
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
STANDIN = "container-entry/dlc-standin:latest"


@dataclass(frozen=True)
class Need:
    """GiB a target needs under the repository (build/, .venv) and under docker's data root."""

    repo: float
    docker: float

    def __add__(self, other: Need) -> Need:
        return Need(repo=self.repo + other.repo, docker=self.docker + other.docker)


class Standin(enum.Enum):
    """How much of the stand-in a run still has to make."""

    BUILT_HERE = "built here"
    IMAGE_ONLY = "image only"  # stage the wheels again (the lock makes them the image's)
    ABSENT = "absent"  # stage and build


STAGE = Need(repo=4, docker=0)  # build/standin: the Python tree and the wheels
IMAGE_BUILD = Need(repo=0, docker=20)  # the first stage beside the new image, at the peak
# what each make target needs once the stand-in is there
AFTER = {
    "standin": Need(repo=1, docker=1),
    "demo": Need(repo=2, docker=2),
    "test": Need(repo=3, docker=4),
}
TARGETS = (*AFTER, "standin-image")


def need(target: str, standin: Standin) -> Need:
    """The GiB `target` needs with the stand-in in this state."""
    if target == "standin-image":  # asked by build-standin.sh, wheels staged, build coming
        return IMAGE_BUILD
    total = AFTER[target]
    if standin is not Standin.BUILT_HERE:
        total += STAGE
    if standin is Standin.ABSENT:
        total += IMAGE_BUILD
    return total


def docker_root() -> Path:
    """Where docker keeps images (`docker info`), or its default when no engine answers."""
    try:
        shown = subprocess.run(
            ["docker", "info", "--format", "{{.DockerRootDir}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        shown = ""
    return Path(shown or "/var/lib/docker")


def standin_state(repo: Path, image: str = STANDIN) -> Standin:
    """BUILT_HERE where this checkout built or checked the image: its smoke test's record
    (build/logs/smoke.ok, written by scripts/build/build-standin.sh: "<image id> <test's sum>")
    names it. IMAGE_ONLY where the image exists without that record (a fresh clone)."""
    try:
        shown = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", image],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return Standin.ABSENT
    if shown.returncode != 0 or not shown.stdout.strip():
        return Standin.ABSENT
    try:
        record = (repo / "build" / "logs" / "smoke.ok").read_text().split()
    except (OSError, UnicodeDecodeError):
        return Standin.IMAGE_ONLY
    return Standin.BUILT_HERE if record[:1] == [shown.stdout.strip()] else Standin.IMAGE_ONLY


def existing(path: Path) -> Path:
    """The path, or its nearest existing parent (docker's root may not exist yet)."""
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def shortfall(target: str, need: Need, repo: Path, docker: Path) -> str | None:
    """None when there is room; else the one line that says what is needed and what is free.
    Two folders on one filesystem need the sum there."""
    wants: dict[int, tuple[float, list[Path]]] = {}
    for path, gib in ((existing(repo), need.repo), (existing(docker), need.docker)):
        device = os.stat(path).st_dev
        total, paths = wants.get(device, (0.0, []))
        wants[device] = (total + gib, [*paths, path])
    for gib, paths in wants.values():
        free = shutil.disk_usage(paths[0]).free / GIB
        if free < gib:
            where = " and ".join(str(p) for p in dict.fromkeys(paths))
            what = "the stand-in's docker build" if target == "standin-image" else f"make {target}"
            return (
                f"[disk] {what} needs about {gib:.0f} GiB free on the filesystem of "
                f"{where}; {free:.1f} GiB is free (free some: `docker system prune`, or remove "
                f"build/)"
            )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--for", dest="target", choices=TARGETS, default="test")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--docker-root", type=Path, default=None)
    parser.add_argument(
        "--need-gib", type=float, default=None, help="override: GiB on each folder (tests)"
    )
    args = parser.parse_args(argv)
    wanted = need(args.target, standin_state(args.repo))
    if args.need_gib is not None:
        wanted = Need(repo=args.need_gib, docker=args.need_gib)
    problem = shortfall(args.target, wanted, args.repo, args.docker_root or docker_root())
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
