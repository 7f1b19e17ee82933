"""Free disk before a build (`make demo`, `make test`, `make standin`): one line and exit 1 at
once, instead of `no space left on device` eight minutes into the stand-in's build.

What the figures come from (this machine, 2026-12-04): building the stand-in from nothing keeps
build/standin (the staged Python and the wheels, 4.1 GB) and the image (8.0 GB), and holds its
first build stage (about 12 GB) until the second is done; the tests' and the demo's images are
layers on the stand-in (tens of MB each), the SDK test venvs 1.0 GB, .venv about 1 GB. Once the
stand-in exists, a run needs only those last few GB.

    python3 -m scripts.disk_space [--for demo|test|standin] [--repo DIR] [--docker-root DIR]

Stdlib only: it runs before the venv exists.
"""

from __future__ import annotations

import argparse
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


# the stand-in built already / built by this run
NEEDS = {
    "standin": (Need(repo=1, docker=1), Need(repo=5, docker=21)),
    "demo": (Need(repo=2, docker=2), Need(repo=6, docker=22)),
    "test": (Need(repo=3, docker=4), Need(repo=7, docker=24)),
}


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


def standin_built(repo: Path, image: str = STANDIN) -> bool:
    """The stand-in exists and this checkout built or checked it: its smoke test's record
    (build/logs/smoke.ok, written by scripts/build-standin.sh: "<image id> <test's sum>")
    names the image. A fresh clone beside an image of another checkout restages 4 GB of
    wheels and may rebuild the image, so it needs the full figure."""
    try:
        shown = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", image],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    try:
        record = (repo / "build" / "logs" / "smoke.ok").read_text().split()
    except OSError:
        return False
    return shown.returncode == 0 and record[:1] == [shown.stdout.strip()]


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
            return (
                f"[disk] make {target} needs about {gib:.0f} GiB free on the filesystem of "
                f"{where}; {free:.1f} GiB is free (free some: `docker system prune`, or remove "
                f"build/)"
            )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--for", dest="target", choices=sorted(NEEDS), default="test")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--docker-root", type=Path, default=None)
    parser.add_argument(
        "--need-gib", type=float, default=None, help="override: GiB on each folder (tests)"
    )
    args = parser.parse_args(argv)
    built, fresh = NEEDS[args.target]
    need = built if standin_built(args.repo) else fresh
    if args.need_gib is not None:
        need = Need(repo=args.need_gib, docker=args.need_gib)
    problem = shortfall(args.target, need, args.repo, args.docker_root or docker_root())
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
