"""The preflight and the user's Python script in one interpreter: `import torch` paid once.

The rank's wrapper (worker.py) runs this by path in the rank's slot, `python -u
preflight_then_script.py SCRIPT ARGS...`, when the preflight is due and the entry script is
Python (a shell entry script keeps a process of its own). It runs the preflight (preflight.py:
its process group destroyed at the end, its store keys under a prefix of their own, its CUDA
context on this rank's own GPU), says how it went through the control folder's markers, then
runs SCRIPT as `python -u SCRIPT ARGS...` would (`run_as_main`): `__main__` with its file,
loader and no spec, `sys.argv`, `sys.path[0]` the script's real folder, so pickling by
`__main__` and multiprocessing's spawn find it; an exception is printed and exits 1 as Python's
own would, without our frames; KeyboardInterrupt ends the process by SIGINT.

One difference, on purpose: after the preflight the current CUDA device is the rank's own
(LOCAL_RANK), not GPU 0, so a script that never calls `torch.cuda.set_device` no longer puts
every rank's tensors on GPU 0.

Not for every script (`shares_python`): CUDA reads CUDA_VISIBLE_DEVICES when it starts, NCCL
its NCCL_* variables once per process, OpenMP its thread count when torch loads; after the
preflight in the same process, a script that sets one of them itself would silently get
other devices, NCCL settings or threads. A script whose text names one of them gets the
preflight in a process of its own, as before.
"""

from __future__ import annotations

import atexit
import builtins
import os
import signal
import sys
import types
from importlib.machinery import SourceFileLoader
from pathlib import Path

# what each rank runs before the script (plan.py puts it in the command record); a program of
# its own when it cannot share the script's Python (`python -u PREFLIGHT_SCRIPT`)
from container_entry.common.programs import PREFLIGHT_SCRIPT

MARKERS_ENV = "_CONTAINER_ENTRY_PREFLIGHT_MARKERS"  # the control folder; removed before SCRIPT
# read once per process, before the script could set them after an in-process preflight
READ_AT_START = (b"CUDA_VISIBLE_DEVICES", b"NCCL_", b"OMP_NUM_THREADS", b"MKL_NUM_THREADS")
SCAN_BYTES = 8 * 1024 * 1024


def shares_python(preflight: list[str], script: str) -> bool:
    """Whether the preflight may run in this script's own Python: ours (not another program),
    and a Python file whose text does not name a variable that only counts before CUDA, NCCL
    or OpenMP start."""
    if preflight != [PREFLIGHT_SCRIPT] or not script.endswith(".py"):
        return False
    try:
        with open(script, "rb") as handle:
            text = handle.read(SCAN_BYTES)
    except OSError:  # Python itself will say why it cannot run it, in its own process
        return False
    return not any(name in text for name in READ_AT_START)


def run_as_main(argv: list[str]) -> None:
    """Run `argv[0]` with `argv[1:]` in this process as `python argv[0] ...` would."""
    script = argv[0]
    try:
        with open(script, "rb") as handle:
            source = handle.read()
    except OSError as error:  # Python's own words and code for a script it cannot open
        name = os.path.abspath(script)
        words = f"[Errno {error.errno}] {error.strerror}"
        print(f"{sys.executable}: can't open file {name!r}: {words}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    path = os.path.abspath(script)  # as Python 3.9+ makes `__file__` of the main script
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __loader__=SourceFileLoader("__main__", path),
        __spec__=None,
        __package__=None,
        __builtins__=builtins,
        __annotations__={},
    )
    sys.modules["__main__"] = main
    try:
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
    except SystemExit:
        raise
    except BaseException as error:  # every uncaught one, as Python ends
        _die_of(error)


def _die_of(error: BaseException) -> None:
    """What Python does with an uncaught exception: the traceback from the script's first
    frame (ours are not the user's), sys.last_* set, exit 1; KeyboardInterrupt: SIGINT."""
    trace = error.__traceback__
    trace = trace.tb_next if trace is not None else None  # run_as_main's own frame
    error.__traceback__ = trace
    sys.last_type, sys.last_value, sys.last_traceback = type(error), error, trace
    if sys.version_info >= (3, 12):
        sys.last_exc = error
    sys.excepthook(type(error), error, trace)
    if isinstance(error, KeyboardInterrupt):
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(1)


def main() -> None:
    from container_entry.common.layout import ControlDir
    from container_entry.diagnose.hang import report_progress
    from container_entry.rank import preflight

    control = ControlDir(Path(os.environ.pop(MARKERS_ENV, "") or "."))
    rank = int(os.environ.get("RANK", "0"))
    hook = sys.excepthook  # torch.distributed installs its own as a group starts: the script's
    code = preflight.run()  # own init_process_group does that again, if it calls one
    sys.excepthook = hook
    (control.preflight_failed if code else control.preflight_passed).touch()
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    control.passed_by(rank).touch()
    report_progress()  # the script's start-up counts from its own start, as at launch
    run_as_main(sys.argv[1:])


if __name__ == "__main__":
    main()
