"""The rank's program: what torchrun starts in each rank's slot (`python -m container_entry.worker`)
instead of the user's script. Its first lines note a stop signal; the wrapper it runs
(rank/wrapper.py) relays the script's lines, runs the preflight and the script, and writes the
rank's record; its exit status is the script's, or 0 after a stop (the record keeps the real
one), which torchrun must not take for a failure.
"""

from __future__ import annotations

import signal
import time

if __name__ == "__main__":  # the rank's wrapper: a stop is noted from its first line on
    from container_entry.common.stopping import catch_together

    _EARLY: dict[int, float] = {}
    catch_together(lambda signum, _: _EARLY.setdefault(signum, time.time()))

import contextlib
import os
import sys
from pathlib import Path

from container_entry.common.layout import CONTROL_ENV, ControlDir
from container_entry.common.records import Command
from container_entry.common.text import escaped
from container_entry.rank.signals import RankStop, end_with_parent
from container_entry.rank.wrapper import Wrapper


def main(argv: list[str]) -> int:
    """The rank's wrapper, from its command file to its exit status (see the module's text)."""
    stop = RankStop.noted(globals().get("_EARLY") or {})  # first: a stop during the start is noted
    end_with_parent()
    control = ControlDir(Path(os.environ.get(CONTROL_ENV) or "."))
    try:
        command = Command.read(control.command)
    except (OSError, ValueError) as error:
        where = escaped(str(control.path))
        print(f"container_entry.worker: no command in {where}: {error}", file=sys.stderr)
        return 2
    wrapper = Wrapper(command, control, stop)
    if command.preflight and control.preflight_failed.exists():
        # a failed preflight ends the job (failure.permanent), but torchrun with restarts may
        # start the group again before the bootstrap tears it down: that attempt runs nothing
        # and leaves the first attempt's record as it is
        wrapper.close()
        return 0 if stop.requested(control) else 1
    ended = wrapper.run_stages([*command.argv, *argv])
    stopped = stop.requested(control)
    wrapper.save(ended)
    wrapper.close()
    if stopped:  # torchrun must not take this for a failure (the record has the status)
        return 0
    status = ended.status
    if status < 0:  # die the same way so torchrun reports the real signal
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's disposition is fixed
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status  # it is blocked or ignored here: the shell's code for it
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
