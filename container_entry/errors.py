"""Errors the bootstrap reports to the user as one line, a failure file and an exit code; and the
one policy for the text it writes (names that are not UTF-8) and the signals it names.

Text: file names, paths, environment values and arguments reach Python as `str` with every byte
that is not UTF-8 as a lone surrogate (PEP 383: `donn\\xe9es.csv` is 'donn\\udce9es.csv'), and
JSON may carry unpaired surrogates (`"\\ud800"`) too; a strict UTF-8 writer fails on both. So
everything the bootstrap writes as text (its stdout and stderr, the failure file, failure.json,
records, tracebacks) goes through the ESCAPE error handler: such a byte is written as `\\xNN`,
another lone surrogate as `\\udNNN`. What results is always valid UTF-8 (SageMaker reads the
failure file as text), never a crash, and the byte is still readable. A name put in a one-line
message goes through `quoted` (or `escaped`): the same, plus control characters escaped, so no
name can break a line. Bytes a rank printed are relayed unchanged.

Stdlib only: the per-rank wrapper uses it too.
"""

from __future__ import annotations

import codecs
import re
import signal

ESCAPE = "container-entry-escape"  # the error handler for every text the bootstrap writes


def _escape(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    return "".join(map(_escaped_char, error.object[error.start : error.end])), error.end


def _escaped_char(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, f"\\x{code:02x}")
    return f"\\u{code:04x}"


codecs.register_error(ESCAPE, _escape)

# what could end a line (str.splitlines' breaks, all of C0 and C1) or not be text at all
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` as it is written: lone surrogates as `\\xNN` / `\\udNNN` (valid UTF-8 anywhere)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", ESCAPE).decode("utf-8")
    return text


def escaped(text: str) -> str:
    """A name, path or value inside a one-line message: undecodable bytes as `\\xNN`, control
    characters and line breaks as `\\n`, `\\x1b`, ...; everything else as it is."""
    return _UNSAFE.sub(lambda match: _escaped_char(match.group()), text)


def quoted(text: str) -> str:
    """`escaped` in quotes: 'donn\\xe9es.csv'."""
    return f"'{escaped(text)}'"


def encoded(text: str) -> bytes:
    """Text of ours as bytes for a console or a log: UTF-8, lone surrogates as `\\xNN`."""
    return text.encode("utf-8", ESCAPE)


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
    return 128 + (signal_number(name or "SIGTERM") or signal.SIGTERM)


STOPPED_EXIT_CODE = 128 + signal.SIGTERM  # 143: the shell's code for a SIGTERM'd process


class BootstrapError(Exception):
    """A problem the user can fix (bad input, missing script...): reported in one line.

    `exit_code` is what the container exits with; 2 follows the convention for usage errors so a
    configuration problem is never confused with a worker's own exit code.
    """

    exit_code = 2


class ConfigError(BootstrapError):
    """A configuration file or value is malformed or inconsistent."""


class CodeError(BootstrapError):
    """The user's code cannot be found, fetched or prepared."""


class NetworkError(BootstrapError):
    """A peer host never became reachable, never joined, or a port is taken."""

    exit_code = 3


class DeviceError(BootstrapError):
    """This host's GPUs are not usable as counted (driver, runtime, visibility)."""

    exit_code = 4


class StopRequested(BootstrapError):
    """SIGTERM/SIGINT/SIGHUP before the workers started: exit as a stopped job (128+N)."""

    exit_code = STOPPED_EXIT_CODE

    def __init__(self, message: str, signal_name: str = "SIGTERM") -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.exit_code = stopped_exit_code(signal_name)
