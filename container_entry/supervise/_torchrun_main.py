"""torchrun's interpreter, started early (prestart.Prestarted), run by path: it imports
torch's launcher (most of its start-up), then waits for its command line, environment and folder
(JSON on the pipe `argv[1]`) and runs as `python -m torch.distributed.run` would. EOF without a
launch (the bootstrap failed, was stopped, or died before it): it exits quietly. Nothing of the
bootstrap's package is imported here: its own folder leaves sys.path first.

One thing it adds to torchrun: the host that serves the rendezvous store leaves last. torch's
exit barrier lets every agent go once the last one checks in, so the store's host could exit
while the last agent still waited on it, or while c10d's rendezvous shutdown still wrote to it:
a "Failed to recv" traceback on a job that succeeded (pytorch/pytorch#69520). Here every other
agent, once its torchrun is done with the store, checks out; the store's host waits for them
(at most LEAVE_SECONDS: an agent that died never checks out).
"""

import contextlib
import ctypes
import json
import os
import sys
import time

_PR_SET_PDEATHSIG, _SIGKILL = 1, 9
EXIT_BARRIER = "torchelastic/agent/terminal_state"  # torch's _TERMINAL_STATE_SYNC_ID
LEFT = "container-entry/left"  # how many agents, not the store's host, are done with it
LEAVE_SECONDS = 10.0  # an agent checks out in milliseconds after the barrier
_LISTEN = "0A"  # TCP state in /proc/net/tcp


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


def watch_exit_barrier() -> list:
    """[store, agents] once this torchrun's exit barrier passed; empty until then, and for a
    torch without that barrier (nothing is changed)."""
    passed: list = []
    try:
        import torch.distributed.elastic.utils.store as store_util

        barrier = store_util.barrier
    except (ImportError, AttributeError):
        return passed

    def watched(*args, **kwargs):
        barrier(*args, **kwargs)
        given = dict(enumerate(args))  # barrier(store, world_size, key_prefix, ...)
        if kwargs.get("key_prefix", given.get(2)) == EXIT_BARRIER:
            passed[:] = [kwargs.get("store", given.get(0)), kwargs.get("world_size", given.get(1))]

    store_util.barrier = watched
    return passed


def serves(store) -> bool:
    """This process listens on the store's port: it is the store's host (whatever the
    rendezvous, node rank or the user's PET_* settings made it)."""
    port = getattr(getattr(store, "_underlying_non_prefix_store", store), "port", None)
    if not port:
        return False
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                mine.add(link[8:-1])
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if fields[3] == _LISTEN and local_port == port and fields[9] in mine:
                    return True
    return False


def leave(passed: list) -> None:
    """Check out of the store, or, as its host, wait until every other agent has."""
    if len(passed) != 2 or not isinstance(passed[1], int) or passed[1] < 2:
        return
    store, agents = passed
    with contextlib.suppress(Exception):
        if not serves(store):
            store.add(LEFT, 1)  # this agent's last word to the store
            return
        deadline = time.monotonic() + LEAVE_SECONDS
        while store.add(LEFT, 0) < agents - 1 and time.monotonic() < deadline:
            time.sleep(0.01)


def import_launcher():
    """torch.distributed.run, imported with numpy's OpenBLAS, which torch loads, on one thread:
    it starts one per CPU but one (95 on a 96-CPU instance), idle in a launcher that does no
    linear algebra. The variable lasts the import only: OpenBLAS reads it as it loads, and the
    workers get the launch's environment. A user's own value stays. (The cyclic GC is left
    alone: paused for the import, its ~310 collections were only put off to the launcher's
    first work, 1.00x the CPU in all, docs/benchmarks.md.)"""
    blas = "OPENBLAS_NUM_THREADS"
    ours = blas not in os.environ
    if ours:
        os.environ[blas] = "1"
    try:
        import torch.distributed.run as run
    finally:
        if ours:
            os.environ.pop(blas, None)
    return run


def main() -> None:
    pipe, parent = int(sys.argv[1]), int(sys.argv[2])
    _die_with(parent)
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]
    run = import_launcher()

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
    passed = watch_exit_barrier()
    try:
        run.main(launch["args"])
    except BaseException as ended:
        if type(ended).__name__ != "SignalException":  # stopped: nobody waits for a stop
            leave(passed)
        raise
    leave(passed)


if __name__ == "__main__":
    main()
