"""Starting torchrun: plain (`spawn`) or early (`Prestarted`), in a process group of its own
either way (a signal to the bootstrap's group, a terminal's Ctrl-C, never reaches it: only the
bootstrap signals it), its stderr the bootstrap's to pump (torchrun_output.py).

Early means at the bootstrap's first moment, before its own imports and the plan: torchrun's
`import torch` is the longest step on a job's way to its first all_reduce, and every
millisecond the bootstrap spends before starting it was paid on that way (docs/benchmarks.md,
"READY"). Light on purpose: the cli imports this before anything else of the package.

May import: common (console, programs).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Mapping, Sequence

from container_entry.common.console import write_all
from container_entry.common.programs import TORCHRUN_MAIN, TORCHRUN_MODULE, UNBUFFERED

# what an interpreter reads once, at its start (sys.path, buffering, the dynamic loader): the
# only part of the environment a launch cannot hand over later
START_PREFIXES = ("PYTHON", "LD_")
PATH_VAR = "PYTHONPATH"


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> subprocess.Popen:
    """torchrun started afresh: through the same main as an early one (`_torchrun_main`: the
    store's host leaves last), else, for any other command, as it is."""
    if list(argv[1:3]) == ["-m", TORCHRUN_MODULE]:
        fresh = Prestarted(argv[0], env)
        if fresh.process is not None:
            return fresh.launch(argv, env, cwd)
    return subprocess.Popen(
        list(argv), env=dict(env), cwd=cwd, stderr=subprocess.PIPE, process_group=0
    )


def start_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment torchrun's interpreter starts with before the plan exists: the user's,
    unbuffered unless they said otherwise (as the plan will say)."""
    env = dict(environ)
    env.setdefault(*UNBUFFERED)
    return env


def _start_part(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(START_PREFIXES)}


def added_path(started: Mapping[str, str], final: Mapping[str, str]) -> list[str] | None:
    """The sys.path entries a launch with `final` must add to an interpreter started with
    `started`; None when that interpreter cannot become what `final` would have started (then
    a fresh one is started). The plan adds PYTHONPATH (the code folder, absolute) where the user
    set none: Python puts those entries right after sys.path[0], which `launch` does."""
    before, after = _start_part(started), _start_part(final)
    if before == after:
        return []
    if PATH_VAR in before or PATH_VAR not in after:
        return None
    entries = after.pop(PATH_VAR).split(os.pathsep)
    if before != after or not all(os.path.isabs(e) for e in entries):
        return None
    return entries


class Prestarted:
    """torchrun's interpreter, started before the plan: `import torch` (1.2 s of torchrun's
    start on a 2-CPU host) then overlaps the bootstrap's own start, plan, join and code fetch
    instead of following them. `launch` hands it the plan's command line, the final environment
    and the code folder (it may not exist before the code is fetched); what runs from there is
    `python -m torch.distributed.run ARGS` as the final environment would have started it (a
    PYTHONPATH the plan added goes where Python puts it; any other difference in what an
    interpreter reads at its start, another Python or command: a fresh torchrun instead).
    `discard` ends it unused."""

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        self.python = python
        self.env = dict(env)
        read, self._pipe = os.pipe()
        try:
            self.process: subprocess.Popen | None = subprocess.Popen(
                [python, TORCHRUN_MAIN, str(read), str(os.getpid())],
                env=self.env,
                stderr=subprocess.PIPE,
                pass_fds=(read,),
                process_group=0,  # as spawn(): only the bootstrap signals torchrun
            )
        except OSError:  # no such Python: the launch reports it as it always has
            self.process = None
            os.close(self._pipe)
        finally:
            os.close(read)
        self._handed = False

    def launch(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str, ready: str | None = None
    ) -> subprocess.Popen:
        """The running torchrun, or a fresh one where this one cannot become it. `ready`: a
        file it touches once its import is done and the launch came."""
        path = added_path(self.env, env)
        fits = list(argv[:3]) == [self.python, "-m", TORCHRUN_MODULE] and path is not None
        if self.process is None or not fits or self._handed:
            self.discard()
            return spawn(argv, env, cwd)
        self._handed = True
        launch = {"args": list(argv[3:]), "env": dict(env), "cwd": cwd, "ready": ready}
        launch["path"] = path
        message = json.dumps(launch).encode()
        # from a thread: the pipe takes 64 KiB while the import runs, and the monitor must run
        # meanwhile (a stop, a dead torchrun)
        threading.Thread(target=self._send, args=(message,), daemon=True).start()
        return self.process

    def _send(self, message: bytes) -> None:
        with contextlib.suppress(OSError):  # it died: the monitor reports its exit
            write_all(self._pipe, message)
        with contextlib.suppress(OSError):
            os.close(self._pipe)

    def discard(self) -> None:
        """End it if it was never launched (EOF first: it exits on its own once imported)."""
        if self._handed:
            return
        self._handed = True
        with contextlib.suppress(OSError):
            os.close(self._pipe)
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
