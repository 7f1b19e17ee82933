"""torchrun's interpreter, started early (prestart.Prestarted), run by path: it imports
torch's launcher (most of its start-up), then waits for its command line, environment and folder
(JSON on the pipe `argv[1]`) and runs as `python -m torch.distributed.run` would. EOF without a
launch (the bootstrap failed, was stopped, or died before it): it exits quietly. Nothing of the
bootstrap's package is imported here: its own folder leaves sys.path first.
"""

import contextlib
import ctypes
import json
import os
import sys

_PR_SET_PDEATHSIG, _SIGKILL = 1, 9


def _die_with(parent: int) -> None:
    """torchrun runs in a process group of its own, so nothing else ends it with the
    bootstrap: the kernel kills it when the bootstrap dies (outside a container)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, _SIGKILL)
    if os.getppid() != parent:  # the bootstrap died before that took
        sys.exit(0)


def _read(pipe: int) -> bytes:
    chunks = []
    while chunk := os.read(pipe, 1 << 16):
        chunks.append(chunk)
    os.close(pipe)
    return b"".join(chunks)


def main() -> None:
    pipe, parent = int(sys.argv[1]), int(sys.argv[2])
    _die_with(parent)
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]
    import torch.distributed.run as run

    data = _read(pipe)
    if not data:
        sys.exit(0)
    launch = json.loads(data)
    if launch.get("ready"):  # its start-up is done: no script's silence (the hang watchdog)
        with contextlib.suppress(OSError):
            open(launch["ready"], "w").close()
    os.environ.clear()
    os.environ.update(launch["env"])
    os.chdir(launch["cwd"])
    # a PYTHONPATH it did not start with (the plan's code folder): where Python puts it, after
    # the first entry (prestart.added_path)
    sys.path[0:0] = launch.get("path") or []
    if not getattr(sys.flags, "safe_path", False):  # as `-m` puts it
        sys.path.insert(0, os.getcwd())
    sys.argv = [run.__file__, *launch["args"]]
    run.main(launch["args"])


if __name__ == "__main__":
    main()
