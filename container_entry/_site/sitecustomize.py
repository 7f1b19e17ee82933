"""Loaded only in the workers' own Python (the worker wrapper appends this folder to their
PYTHONPATH): registers faulthandler on SIGUSR2 so the launcher can record every thread's stack
before it tears a rank down, without any change to the user's script. Chains to the next
sitecustomize on sys.path, if the image has one."""

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

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here]
)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
