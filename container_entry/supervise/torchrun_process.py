"""Starting torchrun: early, while the bootstrap still joins the other hosts (`Prestarted`),
or plain (`spawn`), in a process group of its own either way (a signal to the bootstrap's group,
a terminal's Ctrl-C, never reaches it: only the bootstrap signals it), its stderr the
bootstrap's to pump (torchrun_output.py); and the environment its workers get.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Mapping, Sequence

from container_entry.common.console import write_all
from container_entry.common.layout import CONTROL_ENV, ControlDir
from container_entry.common.programs import TORCHRUN_MAIN
from container_entry.plan.plan import Plan
from container_entry.plan.torchrun import MODULE
from container_entry.rank.preflight import EXPECTED_GPUS_ENV


def child_environment(
    plan: Plan, environ: Mapping[str, str], control: ControlDir | None = None
) -> dict[str, str]:
    """The user's environment plus the plan's additions (which never overwrite user values)."""
    env = dict(environ)
    for name, var in plan.env.items():
        env.setdefault(name, var.value)
    if control is not None:
        env[CONTROL_ENV] = str(control.path)
    env[EXPECTED_GPUS_ENV] = str(plan.num_gpus)  # read by the preflight only
    return env


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> subprocess.Popen:
    """torchrun as a plain process."""
    return subprocess.Popen(
        list(argv), env=dict(env), cwd=cwd, stderr=subprocess.PIPE, process_group=0
    )


class Prestarted:
    """torchrun's interpreter started while the bootstrap still joins the other hosts and
    prepares the code: `import torch` (1.2 s of torchrun's 1.8 s start on a 2-CPU host,
    docs/benchmarks.md) then overlaps that work instead of following it. `launch` hands it the
    plan's command line, the final environment (the join may still change it: hosts sharing a
    machine) and the code folder (it may not exist before the code is fetched); what runs from
    there is exactly `python -m torch.distributed.run ARGS`. `discard` ends it unused."""

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        read, self._pipe = os.pipe()
        try:
            self.process: subprocess.Popen | None = subprocess.Popen(
                [python, TORCHRUN_MAIN, str(read), str(os.getpid())],
                env=dict(env),
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
        """The running torchrun; its Python must be the one this was started with. `ready`: a
        file it touches once its import is done and the launch came."""
        if self.process is None or list(argv[1:3]) != ["-m", MODULE] or self._handed:
            self.discard()
            return spawn(argv, env, cwd)
        self._handed = True
        launch = {"args": list(argv[3:]), "env": dict(env), "cwd": cwd, "ready": ready}
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
