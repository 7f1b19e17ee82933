"""torchrun's stderr, pumped by the bootstrap: masked, its noise held back, its tail kept for
the failure report."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import subprocess
from collections import deque

from container_entry.common import logs
from container_entry.common.console import locked_write
from container_entry.common.text import TRACEBACK

# argparse's last line when torchrun rejects its command line ("run.py: error: ...")
USAGE_ERROR = re.compile(r"^(?:\S*run\.py|torchrun|\S+): error: (.+)$")


class TorchrunOutput:
    """torchrun's stderr: its own lines, and whatever else its workers write to the stderr
    they inherit. The workers' relayed lines do not come this way: each worker writes them
    straight to our own stderr (`worker_stderr`), so they take no second hop through this
    pump; only where that cannot be opened do they arrive here, tagged with this host's
    prefix, and go on to our stderr at once.

    Every line is masked (the bootstrap's masker, every registered secret in every form)
    before it is printed or kept: torchrun prints a failed rank's error file, which holds the
    traceback that torch's `@record` wrote, secrets and all. torchrun's own lines are kept for
    the failure report (`tail`) and shown too, except:
    - its failure report (the `ChildFailedError` traceback and the `====` block with the
      root cause, and its "no error file defined for parent" line): the rank's own lines and
      the failure file already say it; it is kept in `tail`, not shown;
    - argparse's usage block before `run.py: error: ...` (the verdict names it in one line);
    - anything once the bootstrap is tearing the job down (`quiet`): then it is only torchrun
      acknowledging our own signal (a SignalException traceback).
    A traceback of torchrun's is held until its exception line says whether it is the
    failure report; any other (a rendezvous or store error) is shown whole."""

    TRACEBACK = TRACEBACK.encode()
    CHILD_FAILED = b"ChildFailedError"  # torch.distributed.elastic.multiprocessing.errors
    NO_PARENT_FILE = b"no error file defined for parent"  # @record on torchrun's own main

    def __init__(self, own_prefix: bytes) -> None:
        self.own = own_prefix
        self.masker = logs.MASKER  # every secret the plan registered
        self.tail: deque[str] = deque(maxlen=40)
        self.quiet = False  # set by the monitor when it starts a teardown
        self.usage: list[bytes] | None = None  # an argparse usage block being held back
        self.held: list[bytes] | None = None  # a traceback of torchrun's, until its exception
        # inside the failure report: b"" until its opening border, then that border (the
        # report ends at the same line); None outside it
        self.report: bytes | None = None

    @staticmethod
    def worker_stderr() -> str | None:
        """Our stderr as the workers can open it: `/proc/<pid>/fd/2` when it is a pipe (docker),
        a terminal or a regular file; None for anything else (a socket cannot be reopened: the
        workers then write to torchrun's stderr and this pump forwards their lines). A regular
        file is put in append mode first, so our writes and theirs never overwrite each other."""
        try:
            mode = os.fstat(2).st_mode
            if stat.S_ISREG(mode):
                fcntl.fcntl(2, fcntl.F_SETFL, fcntl.fcntl(2, fcntl.F_GETFL) | os.O_APPEND)
            elif not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
                return None
        except OSError:
            return None
        return f"/proc/{os.getpid()}/fd/2"

    @classmethod
    def _failure_report(cls, line: bytes) -> bool:
        """The exception line of torchrun's failure report: `torch...errors.ChildFailedError: `."""
        name = line.split(b":", 1)[0].strip()
        return not line[:1].isspace() and name.rsplit(b".", 1)[-1] == cls.CHILD_FAILED

    def _report_line(self, line: bytes) -> bool:
        """Whether `line` belongs to the failure report's `====` block (hidden)."""
        stripped = line.strip()
        border = bool(stripped) and not stripped.strip(b"=")
        if self.report == b"":  # just after the ChildFailedError line: its opening border
            self.report = stripped if border else None
            return border
        if border and stripped == self.report:
            self.report = None
        return True

    def _shown(self, lines: list[bytes]) -> list[bytes]:
        """The lines to print now (masked already)."""
        shown: list[bytes] = []
        for line in lines:
            if line.startswith(self.own):
                shown.append(line)  # a rank's line: always
            elif self.report is not None and self._report_line(line):
                continue
            elif self.held is not None:
                if not line.strip() or line[:1].isspace():
                    self.held.append(line)  # frames and source lines are indented
                elif self._failure_report(line):
                    self.held, self.report = None, b""
                else:  # another exception: torchrun's own error, shown whole
                    shown += [] if self.quiet else [*self.held, line]
                    self.held = None
            elif line.startswith(self.TRACEBACK):
                self.held = [line]
            elif self.NO_PARENT_FILE in line:
                continue
            elif self.usage is not None:
                if USAGE_ERROR.match(line.decode("utf-8", "replace").strip()):
                    self.usage = None  # usage and error: reported by the verdict instead
                elif line[:1].isspace():
                    self.usage.append(line)  # the usage block's continuation lines
                else:
                    shown += self.usage if not self.quiet else []
                    self.usage = None
                    shown += [] if self.quiet else [line]
            elif line.startswith(b"usage: "):
                self.usage = [line]
            elif not self.quiet:
                shown.append(line)
        return shown

    def _masked_lines(self, data: bytes) -> list[bytes]:
        lines = self.masker.data(data).split(b"\n")
        return lines[:-1] if not lines[-1] else lines

    def _emit(self, lines: list[bytes]) -> None:
        shown = self._shown(lines)
        if shown:
            with contextlib.suppress(OSError):
                locked_write(2, b"\n".join(shown) + b"\n")
        self.tail.extend(
            line.decode("utf-8", "replace") for line in lines if not line.startswith(self.own)
        )

    def pump(self, process: subprocess.Popen) -> None:
        assert process.stderr is not None
        fd = process.stderr.fileno()
        pending = b""
        while chunk := os.read(fd, 65536):
            data = pending + chunk
            cut = data.rfind(b"\n") + 1
            held = self.masker.held(data[:cut]) if cut else 0
            if held:  # the first lines of a multi-line secret, maybe: wait for the rest
                cut = data.rfind(b"\n", 0, cut - held) + 1
            pending = data[cut:]
            if cut:  # whole lines, masked together: a secret may span lines
                self._emit(self._masked_lines(data[:cut]))
        if pending:  # a last line without its end, or lines held back for a secret's rest
            self._emit(self._masked_lines(pending))
        rest = (self.usage or []) + ([] if self.quiet else self.held or [])
        if rest:  # a usage block without its error, a traceback cut short: shown after all
            with contextlib.suppress(OSError):
                locked_write(2, b"\n".join(rest) + b"\n")
