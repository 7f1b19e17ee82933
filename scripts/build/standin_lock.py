"""The stand-in's lock: every wheel it installs, pinned (docker/standin/constraints.txt).

Why: with only the DLC's own pins, pip resolved the other ~80 dependencies to the newest
release at wheel-build time. A release in between (idna 3.21, 2026-12) gave a fresh clone
another wheel set than the checkout that built the image, so each rebuilt the 8 GB stand-in
in turn (8 minutes, 21 GiB of disk at its peak), and the stand-in stopped being one fixed
image as the DLC is. scripts/build/build-standin.sh resolves under this lock (`pip wheel -c`) and
runs `check` on the wheels it got: a wheel the lock does not pin at its version stops the
build with one line.

    python3 -m scripts.build.standin_lock check --wheels DIR [--lock FILE]
    python3 -m scripts.build.standin_lock write --wheels DIR [--lock FILE]   (after changing a pin)

Stdlib only: it runs with the host Python the stand-in is staged from.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

LOCK = Path(__file__).resolve().parents[2] / "docker" / "standin" / "constraints.txt"
HEADER = """\
# Every wheel in the DLC stand-in, pinned: scripts/build/build-standin.sh resolves
# docker/standin/requirements.txt under these constraints and stops on any wheel not pinned
# here at its version (scripts/build/standin_lock.py). requirements.txt says which pins are the
# DLC's; the rest are what pip resolved them to. After changing a pin there, rebuild with
# STANDIN_UNLOCKED=1 and rewrite this file: python3 -m scripts.build.standin_lock write
# --wheels build/standin/wheels
"""
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*===?\s*([^\s;#]+)\s*(?:#.*)?$")


class LockError(ValueError):
    """A lock line or wheel name that cannot be read; the message names it."""


def canonical_name(name: str) -> str:
    """PEP 503: case, runs of '-', '_' and '.' do not tell projects apart."""
    return re.sub(r"[-_.]+", "-", name).lower()


def canonical_version(version: str) -> str:
    """Enough of PEP 440 for equality of released versions: case, a leading 'v', and trailing
    zero release segments (1.0 == 1.0.0) do not tell versions apart."""
    version = version.strip().lower().removeprefix("v")
    found = re.match(r"([0-9]+(?:\.[0-9]+)*)(.*)$", version)
    if not found:
        return version
    release = [str(int(part)) for part in found[1].split(".")]
    while len(release) > 1 and release[-1] == "0":
        release.pop()
    return ".".join(release) + found[2]


def wheel_pin(filename: str) -> tuple[str, str]:
    """(canonical name, version as named) from a wheel's file name (PEP 427:
    name-version[-build]-py-abi-plat.whl)."""
    parts = filename.removesuffix(".whl").split("-")
    if not filename.endswith(".whl") or len(parts) not in (5, 6) or not all(parts):
        raise LockError(f"{filename!r} is not a wheel file name (name-version-py-abi-plat.whl)")
    return canonical_name(parts[0]), parts[1]


def read_lock(path: Path) -> dict[str, str]:
    """canonical name -> version as written; comments and blank lines skipped, anything else
    is an error naming its line."""
    pins: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LockError(f"{path}: cannot read the lock ({exc})") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        found = _PIN.match(line.strip())
        if not found:
            raise LockError(f"{path}:{number}: not a `name==version` pin: {line.strip()!r}")
        name, version = canonical_name(found[1]), found[2]
        if canonical_version(pins.get(name, version)) != canonical_version(version):
            raise LockError(f"{path}:{number}: {found[1]} is pinned twice")
        pins.setdefault(name, version)
    return pins


def unpinned(wheels: list[str], pins: dict[str, str]) -> list[str]:
    """The wheels the lock does not pin at their version, as `name version (lock: ...)`."""
    problems = []
    for filename in sorted(wheels):
        name, version = wheel_pin(filename)
        locked = pins.get(name)
        if locked is None or canonical_version(locked) != canonical_version(version):
            problems.append(f"{name} {version} ({'lock: ' + locked if locked else 'not in lock'})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("check", "write"))
    parser.add_argument("--wheels", type=Path, required=True, help="the stand-in's wheel folder")
    parser.add_argument("--lock", type=Path, default=LOCK)
    args = parser.parse_args(argv)
    wheels = sorted(p.name for p in args.wheels.glob("*.whl"))
    try:
        if args.action == "write":
            pins = dict(wheel_pin(w) for w in wheels)  # as the wheels name them: torch==2.9.0
            body = "".join(f"{name}=={pins[name]}\n" for name in sorted(pins))
            args.lock.write_text(HEADER + body, encoding="utf-8")
            return 0
        if not wheels:
            raise LockError(f"{args.wheels}: no wheels to check")
        problems = unpinned(wheels, read_lock(args.lock))
    except LockError as exc:
        print(f"[standin-lock] {exc}", file=sys.stderr)
        return 1
    if problems:
        print(
            f"[standin-lock] {len(problems)} wheel(s) in {args.wheels} not pinned in "
            f"{args.lock}: {', '.join(problems)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
