"""The checkout's venvs, each a copy of the machine's cached one (issue 35).

    python3 -m scripts.build.dev_venv .venv
    python3 -m scripts.build.dev_venv --requirements requirements/torch-newest.txt \
        .venv-torch-newest

A torch with its CUDA libraries is some 6 GB that pip took about 100 s to unpack into every
fresh clone, before `make test` ran a test. The venv is built once per lock and interpreter
in the machine's cache (~/.cache/container-entry, XDG_CACHE_HOME; `<lock>-venv-<hash>`, e.g.
`dev-venv-...`, a stamp file saying it was built whole) and each checkout gets a copy of it
made of hard links (about a second; a plain copy where the cache is on another file system).
The few files that name the venv's own path (the scripts in bin/, pyvenv.cfg) are written anew
in the copy, so nothing in the copy points back at the cache and nothing written into the
copy reaches it: every file pip or Python writes later is a new file (pip replaces, Python
renames its byte-code into place). The Makefile then installs this checkout into the copy.

Stdlib only: it runs before any venv exists.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "requirements" / "dev.txt"
STAMP = ".requirements.sha256"


def cache_dir() -> Path:
    """The machine's cache of what checkouts build once (this venv, the SDK clients' venvs;
    build-standin.sh's wheels and smoke result name the same folder)."""
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(home) / "container-entry"


def digest(requirements: Path = REQUIREMENTS) -> str:
    """What the cached venv was built from: the lock, and the interpreter that built it."""
    content = requirements.read_bytes() + sys.version.encode() + sys.executable.encode()
    return hashlib.sha256(content).hexdigest()


def log(text: str) -> None:
    print(f"[dev-venv] {text}", file=sys.stderr, flush=True)


def cached(requirements: Path = REQUIREMENTS) -> Path:
    """The machine's venv for this lock, built unless a checkout built it before."""
    key = digest(requirements)
    venv = cache_dir() / f"{requirements.stem}-venv-{key[:16]}"  # dev-venv-..., torch-newest-...
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another checkout may be building it now
        stamp = venv / STAMP
        whole = (venv / "bin" / "python").exists() and stamp.exists()
        if whole and stamp.read_text().strip() == key:
            return venv
        started = time.monotonic()
        log(f"building {venv} from {requirements.relative_to(REPO)} (once per lock)")
        build(venv, requirements)
        stamp.write_text(key + "\n")
        log(f"built in {time.monotonic() - started:.0f} s")
        return venv


def build(venv: Path, requirements: Path = REQUIREMENTS) -> None:
    """A venv with the pinned dev/test dependencies, built in place."""
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PIP_CONSTRAINT": "/dev/null"}  # the lock pins every version itself
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "-q", "-r", str(requirements)], check=True, env=env)


def copy(source: Path, target: Path) -> None:
    """`target` as a copy of the venv `source`: hard links where one file system holds both,
    then every small text file that names `source` written anew naming `target`."""
    scratch = target.with_name(f"{target.name}.partial")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        shutil.copytree(source, scratch, symlinks=True, copy_function=os.link)
    except OSError:  # another file system: a plain copy
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(source, scratch, symlinks=True)
    old, new = str(source).encode(), str(target.resolve()).encode()
    for path in [scratch / "pyvenv.cfg", *(scratch / "bin").iterdir()]:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1_000_000:
            continue
        data = path.read_bytes()
        if old not in data or b"\0" in data:  # a binary keeps its bytes (lengths differ)
            continue
        mode = path.stat().st_mode
        path.unlink()  # a new file: the cache's stays as it is
        path.write_bytes(data.replace(old, new))
        path.chmod(mode)
    (scratch / STAMP).unlink(missing_ok=True)
    shutil.rmtree(target, ignore_errors=True)
    scratch.rename(target)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m scripts.build.dev_venv",
        description="Make VENV_DIR a copy of the machine's cached venv of a lock (built first "
        "if this lock has none yet).",
    )
    parser.add_argument("venv_dir", metavar="VENV_DIR", type=Path)
    parser.add_argument(
        "--requirements", type=Path, default=REQUIREMENTS, help="the lock (requirements/dev.txt)"
    )
    args = parser.parse_args(argv)
    target, requirements = args.venv_dir, args.requirements.resolve()
    try:
        source = cached(requirements)
        copy(source, target)
    except (OSError, subprocess.CalledProcessError) as error:
        log(f"the cached venv could not be used ({error}): building {target} in place")
        build(target, requirements)
        return 0
    log(f"{target} copied from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
