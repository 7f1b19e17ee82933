"""The container's exit codes, the one home of each (docs/failure-stop-logs.md, "Exit codes"),
and the names of the signals they come from. Stdlib only: the per-rank wrapper uses it too."""

from __future__ import annotations

import enum
import re
import signal


class ExitCode(enum.IntEnum):
    """What the container exits with, by meaning. A rank's own failure exits with the rank's
    code (or 128 + its signal): `of_returncode`; a stop, as its signal would: `of_signal`."""

    SUCCESS = 0
    FAILED = 1  # another host died, froze or lost the network; the master was lost
    BAD_INPUT = 2  # a configuration file or value, the code, a usage error
    NETWORK = 3  # a peer never resolved or joined, a port in use, a preflight rank never joined
    DEVICE = 4  # this host's GPUs are not usable as counted
    INTERNAL = 70  # EX_SOFTWARE: a defect of container-entry, never the user's
    HUNG = 124  # timeout(1)'s code for "ran out of time"
    CANNOT_EXECUTE = 126  # an entry script that exists but cannot be run (the shell's code)
    NOT_FOUND = 127  # an entry script or its interpreter that is not there


def of_signal(number: int) -> int:
    """A process ended by signal N exits 128 + N (the shell's convention): 143 for SIGTERM."""
    return 128 + number


def of_returncode(code: int) -> int:
    """A child's return code as the container's: a negative one (killed by signal N) as
    128 + N, any other as it is."""
    return of_signal(-code) if code < 0 else code


def signal_name(number: int) -> str:
    """'SIGKILL'; the real-time signals, which `signal.Signals` mostly does not name, as
    'SIGRTMIN+2' / 'SIGRTMAX-1' as `kill -l` names them; any other number as 'SIG99'."""
    try:
        return signal.Signals(number).name
    except ValueError:
        pass
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if low is not None and high is not None and low < number < high:
        middle = (low + high) // 2
        return f"SIGRTMIN+{number - low}" if number <= middle else f"SIGRTMAX-{high - number}"
    return f"SIG{number}"


def signal_number(name: str) -> int | None:
    """The inverse of `signal_name`; None for a name this system does not have."""
    try:
        return int(signal.Signals[name])
    except KeyError:
        pass
    match = re.fullmatch(r"SIG(RTMIN|RTMAX)([+-]\d+)|SIG(\d+)", name)
    if not match:
        return None
    if match.group(3):
        return int(match.group(3))
    base = getattr(signal, f"SIG{match.group(1)}", None)
    return None if base is None else int(base) + int(match.group(2))


def stopped_exit_code(name: str | None) -> int:
    """A job stopped by a signal exits as a process killed by it would: 128+N (143 SIGTERM,
    130 SIGINT, 129 SIGHUP)."""
    return of_signal(signal_number(name or "SIGTERM") or signal.SIGTERM)
