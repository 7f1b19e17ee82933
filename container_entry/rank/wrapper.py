"""The rank's wrapper, which torchrun starts instead of the user's script (the program is
`-m container_entry.worker`; this module is its body).

What it adds that torchrun's own `--log-dir/--tee/--local-ranks-filter` cannot:
- the script's command line arrives in a private file (records.Command, in the launch's control
  folder), never on torchrun's command line, where argparse would take `--log`, `--node`, ...
  for abbreviations of torchrun's options;
- every line tagged with host and rank and forwarded live (at once after a quiet spell, within
  COALESCE_SECONDS in a burst), registered secrets masked in it, on the console (filtered by
  CONSOLE_RANKS; stderr straight to the container's, not through torchrun) and in a per-rank
  log, from one thread (relay.py);
- console lines that stay whole: every rank of a host writes to the same pipe, and a line
  longer than PIPE_BUF would be cut by another rank's bytes, so each batch is written under an
  flock of that pipe (console.py);
- the relay never ends training: a rank log that cannot be written (a full disk) stops, and so
  does a console nobody reads (EPIPE, EIO), each once, said on the other one and in the record;
  the record itself has space set aside (outcome.save_record);
- a result record (exit status, signal (`SIGRTMIN+2` too: exits.signal_name), the exception
  type and message parsed from what the script printed, an exec failure named: outcome.py) that
  the bootstrap turns into a failure file;
- stacks on demand (SIGUSR2, through _site/sitecustomize.py in the script's own Python), and
  flight-recorder dumps on request (flight_recorder.py).
Stdlib only: it starts in milliseconds. What it writes of its own is valid UTF-8 whatever the
names (text.ESCAPE); what the script printed goes on byte for byte. Its files: layout.py.

Stop signals: the bootstrap signals each worker's process group, which holds this wrapper and the
script alike, so the wrapper does not forward them (that would deliver them twice); it records
that a stop was requested, waits for the script to finish and then exits 0 whatever the script's
status (kept in the record): torchrun must see no failed worker during a stop, or it would
signal the other ranks again, kill them 30 s later (before torch 2.12) or restart the group. A
wrapper that torchrun starts after the stop (the control folder's stop file exists) runs
nothing. A stop is noted from the wrapper's first line on (a SIGINT while it still imports is no
KeyboardInterrupt, a SIGTERM then does not kill it).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from container_entry.common.console import Console, console_stderr
from container_entry.common.exits import signal_name
from container_entry.common.layout import CONTROL_ENV, ControlDir, RunDir
from container_entry.common.logs import PREFIX
from container_entry.common.masking import Masker
from container_entry.common.programs import RANK_RUNNER, SITE_DIR
from container_entry.common.records import Command, RankRecord, WorkerPids
from container_entry.common.text import encoded, escaped
from container_entry.common.workers import adopted, reap_adopted, wait_exited
from container_entry.diagnose import flight_recorder
from container_entry.diagnose.hang import report_progress
from container_entry.rank.launcher_report import worker_failure
from container_entry.rank.preflight_then_script import MARKERS_ENV, shares_python
from container_entry.rank.rank_end import (
    exec_failure,
    fatal_error,
    last_words,
    parse_exception,
    reserve_space,
    save_record,
)
from container_entry.rank.relay import RankLog, Relay, relay
from container_entry.rank.signals import RankStop, become_subreaper

PEERS_DUMP_SECONDS = 2.0  # a dump thread answers in milliseconds; bounded for one that cannot
STACKS_SECONDS = 0.5  # for faulthandler's stacks of this host's other ranks
STACKS_ENV = "_CONTAINER_ENTRY_STACKS"  # read by _site/sitecustomize.py in the script's Python
# how long the script's exit may wait for its process groups' teardown (_site/sitecustomize.py),
# and the file where the script notes when it ended (its exit began: the rank's sockets close
# from then on, before its process ends; a stop after it changes nothing of the script's)
END_GROUPS_ENV = "_CONTAINER_ENTRY_END_GROUPS"
EXITING_ENV = "_CONTAINER_ENTRY_EXITING"


def _exiting_at(path: Path) -> float | None:
    """When the script ended and its exit began, which closes its sockets before its process
    ends: a failure without a traceback (sys.exit(3)) began then, before its peers' errors."""
    try:
        at = float(path.read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None
    return at if math.isfinite(at) else None


class Ended:
    """How a child in the rank's slot ended: its status, why it never started (an exec failure),
    the last lines of its stderr, and the stage ("preflight": the preflight failed)."""

    def __init__(
        self,
        status: int,
        start_error: dict[str, str] | None = None,
        stderr_tail: Sequence[str] = (),
        failed_at: float | None = None,
        script_ended_at: float | None = None,
    ) -> None:
        self.status = status
        self.failed_at = failed_at
        self.script_ended_at = script_ended_at
        self.start_error = start_error
        self.stderr_tail = list(stderr_tail)
        self.stage: str | None = None


class Wrapper:
    """One rank: where its lines go (the consoles, its log), the environment of what it runs,
    what it runs in its slot (the preflight, the script), and its record."""

    def __init__(self, command: Command, control: ControlDir, stop: RankStop) -> None:
        self.command, self.control, self.stop = command, control, stop
        self.run_dir = RunDir(Path(command.run_dir))
        self.rank = int(os.environ.get("RANK", "0"))
        self.host = os.environ.get("CURRENT_HOST") or os.environ.get("HOSTNAME", "localhost")
        # the entry point once on this host: its own launcher's workers are no ranks of ours
        self.once = command.once_env is not None
        tag = f"[{self.host}] " if self.once else f"[{self.host} rank {self.rank}] "
        self.prefix = encoded(tag)
        self.shown = command.shows(self.rank)
        self.masker = Masker(command.secrets)
        self.err_console = Console(console_stderr(command.console_stderr), "console (stderr)")
        self.out_console = Console(1, "console (stdout)")
        self.trouble: dict[str, str] = {}  # what stopped: the rank log, a console
        for folder in (self.run_dir.logs, self.run_dir.stacks):
            with contextlib.suppress(OSError):  # a full disk: the log says so below
                folder.mkdir(parents=True, exist_ok=True)
        self.log = RankLog.open(self.run_dir.log(self.rank), self._log_stopped)
        for stream in (self.out_console, self.err_console):
            stream.on_error = self._console_stopped
        self.reserve = reserve_space(self.run_dir.path)
        self.env = self._environment()
        self.started = time.time()

    def _environment(self) -> dict[str, str]:
        """What the children get: this process's environment, faulthandler on (a segfault
        prints the Python stacks), stacks on demand (SIGUSR2) for the teardown report and
        `container-entry stacks`, flight-recorder dumps on request, the process groups ended
        at exit (GROUP_TEARDOWN_TIMEOUT); not the control folder."""
        once = self.command.once_env
        env = dict(os.environ if once is None else once)  # once: none of torchrun's variables
        env.setdefault("PYTHONFAULTHANDLER", "1")
        # our sitecustomize first on PYTHONPATH (the folder holds nothing else), so one of the
        # user's own cannot hide it; ours then runs theirs
        env[STACKS_ENV] = str(self.run_dir.stack(self.rank))
        env.pop(END_GROUPS_ENV, None)
        env[EXITING_ENV] = str(self.control.exiting(self.rank))
        if self.command.group_teardown_seconds > 0:
            env[END_GROUPS_ENV] = f"{self.command.group_teardown_seconds:g}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (SITE_DIR, env.get("PYTHONPATH")) if p)
        with contextlib.suppress(OSError):  # a full disk: no flight-recorder dump for this rank
            env.update(flight_recorder.listen(self.control, self.run_dir, self.rank))
        env.pop(CONTROL_ENV, None)
        return env

    def say(self, text: str) -> None:
        """One line of ours about this rank, on its stderr console."""
        self.err_console.write(self.prefix + encoded(f"{PREFIX} {text}") + b"\n")

    def _log_stopped(self, what: str) -> None:
        self.trouble.setdefault("log_error", what)
        if self.shown:
            self.say(f"{what}; the console still has every line")
        else:
            self.say(f"{what}; CONSOLE_RANKS hides this rank, so its lines are kept nowhere now")

    def _console_stopped(self, _stream: Console, what: str) -> None:
        self.trouble.setdefault("console_error", what)
        self.log.write(encoded(f"{PREFIX} {what}; the rank log still has every line\n"))

    def run_stages(self, command: list[str]) -> Ended:
        """The preflight, then the script (`command`), in this same slot, so the job needs one
        torchrun launch, not two; the script starts only once the preflight passed (not when a
        stop came while it ran either). The preflight runs once per job on each host: restarts
        skip it, known from the control folder's markers, not from TORCHELASTIC_RESTART_COUNT
        (a host whose workers did not fail themselves rejoins the new round at torchrun's
        count 0)."""
        preflight = list(self.command.preflight)
        script = command[0]
        python = script.endswith(".py")
        due = bool(preflight) and not self.control.preflight_passed.exists()
        if due and shares_python(preflight, script):  # one Python for both: torch imported once
            return self._preflight_then(command)
        if due:
            # the preflight has its own deadline: while it runs it is never a hang (HANG_TIMEOUT)
            checking = threading.Event()
            threading.Thread(target=_keep_alive, args=(checking,), daemon=True).start()
            try:
                ended = self.run_child([sys.executable, "-u", *preflight], preflight[0])
            finally:
                checking.set()
            marker = (
                self.control.preflight_failed if ended.status else self.control.preflight_passed
            )
            with contextlib.suppress(OSError):
                marker.touch()
            if ended.status:
                ended.stage = "preflight"
                return ended
        if preflight:
            report_progress()  # the script's start-up counts from its own start, as at launch
        program = [sys.executable, "-u", *command] if python else command
        return self.run_child(program, script)

    def _preflight_then(self, command: list[str]) -> Ended:
        """The preflight, then the script in the same Python; a failure before this rank's
        preflight passed is the preflight's (its marker says)."""
        passed = self.control.passed_by(self.rank)
        checking = threading.Event()
        keep_alive = threading.Thread(target=_keep_alive, args=(checking, passed), daemon=True)
        keep_alive.start()
        self.env[MARKERS_ENV] = str(self.control.path)
        try:
            ended = self.run_child([sys.executable, "-u", RANK_RUNNER, *command], command[0])
        finally:
            checking.set()
            self.env.pop(MARKERS_ENV, None)
        if ended.status and not passed.exists():
            ended.stage = "preflight"
        return ended

    def run_child(self, argv: list[str], name: str) -> Ended:
        """One child in this rank's slot, its output relayed, to its end. A stop that came
        first means no child at all; one that came while it was being started (before it could
        be in this process group) is passed on to it."""
        if self.stop.requested(self.control):
            return Ended(128 + self.stop.signum)
        exiting = self.control.exiting(self.rank)
        with contextlib.suppress(OSError):
            exiting.unlink()  # a restart's rank's, or the preflight's before the script
        try:
            child = self._start(argv)
        except (OSError, ValueError) as error:  # ValueError: an argument that is no C string
            code, failure = exec_failure(name, error)
            self.log.write(encoded(failure["message"] + "\n"))
            self.err_console.write(self.prefix + encoded(failure["message"]) + b"\n")
            return Ended(code, failure)
        if self.stop.name is not None:  # it arrived during the start: it may not have had it
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(self.stop.signum)
        lingering = None
        if self.once:  # its workers may checkpoint after a stop killed it: kept and relayed
            lingering = lambda: self.stop.name is not None and bool(adopted(child.pid))  # noqa: E731
        shown = self.shown
        relays = [
            Relay(self.out_console if shown else None, self.log, self.prefix, self.masker, False),
            Relay(self.err_console if shown else None, self.log, self.prefix, self.masker, True),
        ]
        pids = self.control.pid_file(self.rank)
        try:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            WorkerPids(self.rank, os.getpid(), child.pid, self.host, local).write(pids)
        except OSError as error:  # the launcher still finds this rank as torchrun's child
            self.say(f"pid file {escaped(str(pids))} not written: {error.strerror or error}")
        assert child.stdout is not None and child.stderr is not None
        streams = [child.stdout.fileno(), child.stderr.fileno()]
        status = relay(child, list(zip(streams, relays, strict=True)), lingering=lingering)
        if self.once:
            self._end_adopted(child.pid)
        gone = time.time()  # the process and its output are done
        ended = _exiting_at(exiting)  # its script ended before (a Python one says when)
        began = [at for at in (relays[1].traceback_at, ended) if at is not None]
        tail = relays[1].tail_lines()
        return Ended(status, None, tail, min(began, default=None), min(ended or gone, gone))

    def _end_adopted(self, child: int) -> None:
        """What the entry point left running once it ended: after a stop, awaited (its workers
        checkpoint; the launcher's SIGKILL ends the grace); otherwise killed, as the DLC's
        container end kills it (a server it started in the background never holds the job)."""
        while self.stop.name is not None and adopted(child):
            time.sleep(0.1)
        for pid in adopted(child):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        wait_exited(adopted(child), 5.0)
        reap_adopted(child)

    def _start(self, argv: list[str]) -> subprocess.Popen:
        """The child; a script without a '#!' line under /bin/sh where the job asks for
        execvp's rule (Command.sh_fallback). The entry point once on this host: this process
        becomes the subreaper of what it starts, so the workers of its launcher stay in this
        rank's tree when their parent dies (a stop, and the teardown, reach them there)."""
        if self.once:
            become_subreaper()
        pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        try:
            return subprocess.Popen(argv, env=self.env, cwd=os.getcwd(), **pipes)
        except OSError as error:
            if error.errno != errno.ENOEXEC or not self.command.sh_fallback:
                raise
        return subprocess.Popen(["/bin/sh", *argv], env=self.env, cwd=os.getcwd(), **pipes)

    def save(self, ended: Ended) -> None:
        """The rank's record, for the bootstrap's monitor and failure file; said on the
        console when it cannot be written (the wrapper goes on)."""
        self.log.close()
        lines = ended.stderr_tail
        status = ended.status
        worker, exception = worker_failure(lines) if self.once and status else (None, None)
        record = RankRecord(
            host=self.host,
            rank=self.rank,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            stage=ended.stage,
            # torchrun's count on this host; a failure with restarts > 0 used them all up
            restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0),
            returncode=status,
            signal=signal_name(-status) if status < 0 else None,
            exception=ended.start_error or exception or parse_exception(lines),
            fatal_error=fatal_error(lines),
            last_words=last_words(lines) if status else None,
            stop=self.stop.came,
            started_at=self.started,
            failed_at=ended.failed_at if status else None,
            script_ended_at=ended.script_ended_at,
            ended_at=time.time(),
            stderr_tail=lines[-40:],
            log=str(self.run_dir.log(self.rank)),
            log_error=self.trouble.get("log_error"),
            console_error=self.trouble.get("console_error"),
            once=escaped(os.path.basename(self.command.argv[0])) if self.once else None,
            worker=worker,
        )
        problem = save_record(self.run_dir.record(self.rank), record.to_json(), self.reserve)
        self.reserve = None  # given back
        if problem:
            self.say(problem)
        # after the record: the bootstrap hears of the failure at once (the job's first failure
        # is decided by when each host's arrives), while torchrun, which ends this host's other
        # ranks when this wrapper exits, waits for their records
        if record.failed and record.stop is None:
            self.peers_records(record)

    def peers_records(self, record: RankRecord) -> None:
        """A collective timed out here: the records of this host's other ranks, asked for
        before this wrapper exits, since torchrun ends them as soon as it sees this one gone
        and the rank they name (the one that never entered the collective) may be among
        them (culprit.py reads them)."""
        from container_entry.common.workers import Workers
        from container_entry.diagnose.failure import is_collective_timeout

        if is_collective_timeout(record):
            started = time.monotonic()
            stacks = any(Workers(self.control).request_stacks().values())  # where each was
            peers = [rank for rank in self.control.dump_ranks() if rank != self.rank]
            flight_recorder.collect(self.control, self.run_dir, peers, PEERS_DUMP_SECONDS)
            if stacks:  # faulthandler writes at once; the dump wait may already cover it
                time.sleep(max(0.0, STACKS_SECONDS - (time.monotonic() - started)))

    def close(self) -> None:
        self.log.close()
        if self.reserve is not None:
            os.close(self.reserve)
            self.reserve = None
        for stream in (self.out_console, self.err_console):
            stream.close()


def _keep_alive(done: threading.Event, until: Path | None = None) -> None:
    """Progress reports for the hang watchdog, every second until `done` (or `until` exists:
    the preflight passed in the script's own Python, whose silence counts from then)."""
    while not done.wait(1.0):
        if until is not None and until.exists():
            return
        report_progress()
