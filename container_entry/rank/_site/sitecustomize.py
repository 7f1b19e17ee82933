"""Loaded only in the workers' own Python (the worker wrapper puts this folder first on their
PYTHONPATH), with no change to the user's script:

- faulthandler on SIGUSR2, so the launcher can record every thread's stack before it tears a
  rank down (`container-entry stacks` uses it too);
- a flight-recorder dump at a death by exception (a collective that timed out raises in the
  rank: its records say which collective it waited in; a rank that exits or is killed is not
  asked then), written at exit beside the requested ones;
- the script's end noted (main returned, sys.exit, an uncaught exception): from that moment, the
  first of Python's shutdown (threading's exit callbacks, before atexit's), a stop signal is
  ignored, so the process exits with the script's own status (the launcher's SIGKILL still
  ends it after the grace), and the moment is written where the wrapper reads it: a stop
  that came later ended nothing of the script (a finished job, not a stopped one), and a
  failure without a traceback (sys.exit(3)) began then, before the sockets its exit closes;
- the script's process groups ended at its exit, after its own exit handlers and the dump
  above, bounded (the GROUP_TEARDOWN_TIMEOUT setting): torch documents that a program should call
  `destroy_process_group` before it exits, and HF Trainer scripts do not. Left to the
  interpreter's finalization, torch 2.15's gloo worker threads (`pt_gloo_runloop`) were killed
  there by Python (a thread taking the GIL then exits by forced unwinding) inside C++ that
  cannot unwind: "terminate called without an active exception", SIGABRT, a finished job
  failed, in about one run in two of a two-rank script (NCCL's watchdog and heartbeat
  threads are ended there too);
- a flight-recorder dump on request: a daemon thread blocked on the rank's request FIFO (it costs
  nothing until asked) writes torch's collective records as JSON, atomically, when the launcher
  writes a byte there. A thread, not a signal handler: a rank that hangs sits in a collective's
  C++ wait, where no Python signal handler runs, but a thread gets the GIL (the wait releases
  it). Both NCCL's recorder and the generic one (gloo, torch 2.8+) are asked; torch is never
  imported here (only a script that imported it has records).

Chains to the next sitecustomize on sys.path, if the image has one. The variables are removed,
so a Python the script starts does not take them over.
"""

import contextlib
import faulthandler
import importlib.machinery
import importlib.util
import os
import signal
import sys

_path = os.environ.pop("_CONTAINER_ENTRY_STACKS", "")
if _path:
    try:
        _file = open(_path, "a")  # noqa: SIM115 - must stay open for the process's lifetime
        faulthandler.register(signal.SIGUSR2, file=_file, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError):
        pass


def _flight_records() -> dict:
    """What torch's flight recorders hold now, by recorder, as parsed JSON."""
    import json  # only when asked: nothing more at every start
    import time

    found: dict = {"pid": os.getpid(), "time": time.time(), "recorders": {}, "errors": {}}
    torch = sys.modules.get("torch")
    c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    if c10d is None:
        found["errors"]["torch"] = "torch.distributed was never imported by this process"
        return found
    cuda = getattr(torch, "cuda", None)
    dumps = [("generic", "_dump_fr_trace_json")]
    # NCCL's own recorder only where CUDA is up: asking must never create a CUDA context
    if cuda is not None and cuda.is_initialized():
        dumps.insert(0, ("nccl", "_dump_nccl_trace_json"))
    for name, function in dumps:
        dump = getattr(c10d, function, None)
        if dump is None:
            continue
        try:
            raw = dump()
            found["recorders"][name] = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        except Exception as error:  # a recorder that cannot be read: say why, keep the others
            found["errors"][name] = f"{type(error).__name__}: {error}"
    return found


def _write_dump(target: str) -> None:
    import json

    try:
        records = _flight_records()
    except Exception as error:  # never take the rank down
        records = {"pid": os.getpid(), "errors": {"dump": f"{type(error).__name__}: {error}"}}
    try:
        temporary = f"{target}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(records, handle, default=str)
        os.replace(temporary, target)  # the launcher waits for the name: complete or absent
    except OSError:
        pass


def _serve_dumps(request: str, target: str) -> None:
    while True:
        try:
            with open(request, "rb") as fifo:  # blocks until the launcher asks
                fifo.read()
        except OSError:
            return
        _write_dump(target)


def _dump_at_death(target: str) -> None:
    """At exit: the records of a script that died of an exception (Python sets sys.last_value
    for an uncaught one, never for sys.exit) and had collectives to record."""
    if getattr(sys, "last_value", None) is not None and "torch.distributed" in sys.modules:
        _write_dump(target)


def _note_the_end(marks: str) -> None:
    """At the script's end, the first thing of Python's shutdown: stop signals ignored (the exit
    status stays the script's own), and the moment written to `marks` for the rank's wrapper."""
    import threading
    import time

    pid = os.getpid()

    def ended() -> None:
        if os.getpid() != pid:  # a forked child's end is not the script's
            return
        for name in ("SIGTERM", "SIGINT", "SIGHUP"):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(getattr(signal, name), signal.SIG_IGN)
        if marks:
            with contextlib.suppress(OSError), open(marks, "w", encoding="ascii") as handle:
                handle.write(repr(time.time()))

    register = getattr(threading, "_register_atexit", None)  # before atexit's, 3.9+
    if register is None:
        import atexit

        register = atexit.register
    with contextlib.suppress(RuntimeError):  # shutdown already began: nothing to note
        register(ended)


def _end_groups_at_exit(wait: float) -> None:
    """destroy_process_group at this process's exit, from a thread started now (Python 3.12
    refuses new threads once its shutdown began) so that a teardown stuck on a peer or a
    pending collective holds the exit `wait` seconds at most, and says so."""
    import atexit
    import threading

    asked, done, pid = threading.Event(), threading.Event(), os.getpid()

    def end() -> None:
        asked.wait()
        try:
            sys.modules["torch.distributed"].destroy_process_group()
        except Exception as error:  # the exit goes on as it would have without us
            sys.stderr.write(
                f"[container-entry] ending the process groups at exit: "
                f"{type(error).__name__}: {error}\n"
            )
        finally:
            done.set()

    def at_exit() -> None:
        if os.getpid() != pid:  # a forked child (no such thread here); the groups are not its
            return
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return
        except Exception:
            return
        # The script has ended (`_note_the_end` ignores a stop from then on): the teardown
        # waits at most `wait` s; the launcher's SIGKILL still ends it.
        asked.set()
        if not done.wait(wait):
            sys.stderr.write(
                f"[container-entry] the process groups' teardown at exit took over {wait:g} s;"
                f" exiting without it\n"
            )

    threading.Thread(target=end, daemon=True, name="container-entry-end-groups").start()
    atexit.register(at_exit)  # first registered, last run: after the script's own and the dump


try:
    _end_wait = float(os.environ.pop("_CONTAINER_ENTRY_END_GROUPS", ""))
except ValueError:
    _end_wait = 0.0
_note_the_end(os.environ.pop("_CONTAINER_ENTRY_EXITING", ""))
if _end_wait > 0:
    _end_groups_at_exit(_end_wait)

_request = os.environ.pop("_CONTAINER_ENTRY_DUMP_REQUEST", "")
_target = os.environ.pop("_CONTAINER_ENTRY_DUMP_FILE", "")
_death_target = os.environ.pop("_CONTAINER_ENTRY_DEATH_DUMP_FILE", "")
if _death_target:
    import atexit

    atexit.register(_dump_at_death, _death_target)
if _request and _target:
    import threading

    threading.Thread(
        target=_serve_dumps, args=(_request, _target), daemon=True, name="container-entry-fr"
    ).start()

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here]
)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
