"""Run an AWS CodeBuild buildspec (version 0.2) on this machine, phase by phase.

What it reproduces, from CodeBuild's buildspec reference and build phase transitions:
- one shell instance (env.shell, bash) for the whole build: exports and `cd` carry over
  from one command and phase to the next;
- env.variables are defaults: the caller's overrides (project or start-build variables) win;
- the CODEBUILD_* variables a build sees (caller-supplied refs; SRC_DIR, BUILD_ID, ... here);
- CODEBUILD_BUILD_SUCCEEDING is 1 until a command fails, then 0;
- a failing command ends its phase (later commands of that phase are skipped), the phase's
  `finally` commands still run; install or pre_build failing ends the build, build failing
  still runs post_build (on-failure: CONTINUE goes on to the next phase regardless);
- env.exported-variables are read from the shell after the last phase.
Not reproduced: runtime-versions (listed in the log, not switched), artifacts, reports and
cache (ignored); parameter-store and secrets-manager (refused: they would need AWS).

    python tests/delivery/codebuild.py buildspec.yml VAR=value ...   (prints the result)
"""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PHASES = ("install", "pre_build", "build", "post_build")
ENDS_BUILD_ON_FAILURE = ("install", "pre_build", "post_build")


class BuildspecError(Exception):
    """The buildspec is not something this harness (or CodeBuild) can run."""


@dataclass
class BuildResult:
    phases: dict[str, str] = field(default_factory=dict)  # SUCCEEDED / FAILED / SKIPPED
    exported: dict[str, str] = field(default_factory=dict)
    log: str = ""

    @property
    def succeeded(self) -> bool:
        return all(status != "FAILED" for status in self.phases.values())


def load(path: Path) -> dict:
    spec = yaml.safe_load(path.read_text())
    if not isinstance(spec, dict) or str(spec.get("version")) != "0.2":
        raise BuildspecError(f"{path}: only buildspec version 0.2 is supported")
    env = spec.get("env") or {}
    for key in ("parameter-store", "secrets-manager"):
        if key in env:
            raise BuildspecError(f"{path}: env.{key} needs AWS; not emulated")
    for name in env.get("exported-variables") or []:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
            raise BuildspecError(f"{path}: exported variable {name!r} is not a variable name")
    if env.get("shell", "bash") != "bash":
        raise BuildspecError(f"{path}: env.shell {env['shell']!r}: only bash is emulated")
    phases = spec.get("phases") or {}
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise BuildspecError(f"{path}: unknown phases {sorted(unknown)}")
    for name, phase in phases.items():
        for key in ("commands", "finally"):
            commands = (phase or {}).get(key, [])
            if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
                raise BuildspecError(f"{path}: phases.{name}.{key} must be a list of strings")
        if (phase or {}).get("on-failure", "ABORT") not in ("ABORT", "CONTINUE"):
            raise BuildspecError(f"{path}: phases.{name}.on-failure must be ABORT or CONTINUE")
    return spec


def say(log_fd: int, message: str) -> None:
    os.write(log_fd, f"[Container] {message}\n".encode())


class Shell:
    """One bash process; commands are sourced into it, their status comes back on a pipe."""

    def __init__(self, cwd: Path, env: Mapping[str, str], log_fd: int, scratch: Path):
        read_end, self._write_end = os.pipe()
        self._scratch = scratch
        self._log_fd = log_fd
        self._count = 0
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=log_fd,
            stderr=log_fd,
            cwd=cwd,
            env=dict(env),
            pass_fds=(self._write_end,),
            text=True,
            start_new_session=True,
        )
        os.close(self._write_end)  # the shell holds it now; reading sees EOF if bash dies
        self._status = os.fdopen(read_end)

    def run(self, command: str, deadline: float, show: bool = True) -> int:
        """Source `command` into the shell (stdin from /dev/null); return its exit status."""
        self._count += 1
        script = self._scratch / f"command-{self._count}.sh"
        script.write_text(command + "\n")
        if show:
            say(self._log_fd, f"Running command {command}")
        fd = self._write_end
        line = f'. {shlex.quote(str(script))} </dev/null {fd}>&-; printf "%s\\n" "$?" >&{fd}\n'
        assert self.process.stdin is not None
        self.process.stdin.write(line)
        self.process.stdin.flush()
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([self._status], [], [], max(remaining, 0))
        if not ready:
            self.kill()
            raise TimeoutError(f"command still running at the build's deadline: {command}")
        status = self._status.readline()
        if not status:
            raise BuildspecError(f"the shell exited during: {command} (CodeBuild fails here too)")
        return int(status)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._status.close()


def codebuild_environment(src_dir: Path, base: Mapping[str, str]) -> dict[str, str]:
    """Variables every CodeBuild build has; the caller's values (refs, region) win."""
    build_id = f"container-entry:{uuid.uuid4()}"
    env = {
        "CODEBUILD_SRC_DIR": str(src_dir),
        "CODEBUILD_BUILD_ID": build_id,
        "CODEBUILD_BUILD_ARN": f"arn:aws:codebuild:us-east-1:123456789012:build/{build_id}",
        "CODEBUILD_BUILD_NUMBER": "1",
        "CODEBUILD_INITIATOR": "local-harness",
        "CODEBUILD_CI": "true",
    }
    env.update(base)
    return env


def run_buildspec(
    path: Path,
    src_dir: Path,
    environment: Mapping[str, str],
    overrides: Mapping[str, str],
    timeout: float = 900,
) -> BuildResult:
    """Run `path` in `src_dir`. environment: the machine's; overrides: the project's."""
    spec = load(path)
    env = codebuild_environment(src_dir, environment)
    env.update({k: str(v) for k, v in ((spec.get("env") or {}).get("variables") or {}).items()})
    env.update(overrides)
    env["CODEBUILD_BUILD_SUCCEEDING"] = "1"
    exported_names = list((spec.get("env") or {}).get("exported-variables") or [])
    phases = spec.get("phases") or {}
    deadline = time.monotonic() + timeout
    result = BuildResult()

    with tempfile.TemporaryDirectory(prefix="codebuild-") as scratch_dir:
        scratch = Path(scratch_dir)
        log_path = scratch / "build.log"
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        shell = Shell(src_dir, env, log_fd, scratch)
        try:
            ended = False
            for name in PHASES:
                if name not in phases:
                    continue
                if ended:
                    result.phases[name] = "SKIPPED"
                    continue
                phase = phases[name] or {}
                say(log_fd, f"Entering phase {name.upper()}")
                for runtime, version in (phase.get("runtime-versions") or {}).items():
                    say(log_fd, f"runtime-versions {runtime}: {version} (not switched here)")
                failed = False
                for command in phase.get("commands") or []:
                    if shell.run(command, deadline) != 0:
                        failed = True
                        break
                for command in phase.get("finally") or []:
                    if shell.run(command, deadline) != 0:
                        failed = True
                result.phases[name] = "FAILED" if failed else "SUCCEEDED"
                say(log_fd, f"Phase {name.upper()} {result.phases[name]}")
                if failed:
                    shell.run("export CODEBUILD_BUILD_SUCCEEDING=0", deadline, show=False)
                    if name in ENDS_BUILD_ON_FAILURE and phase.get("on-failure") != "CONTINUE":
                        ended = True
            values = scratch / "exported"
            names = " ".join(exported_names)
            dump = f'for n in {names}; do printf "%s=%s\\0" "$n" "${{!n-}}"; done'
            shell.run(f"{dump} > {shlex.quote(str(values))}", deadline, show=False)
            for item in values.read_text().split("\0"):
                if item:
                    key, _, value = item.partition("=")
                    result.exported[key] = value
        finally:
            shell.close()
            os.close(log_fd)
            result.log = log_path.read_text(errors="replace")
    return result


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    overrides = dict(item.partition("=")[::2] for item in argv[1:])
    result = run_buildspec(Path(argv[0]), Path.cwd(), dict(os.environ), overrides)
    print(result.log)
    print(f"phases: {result.phases}")
    print(f"exported: {result.exported}")
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
