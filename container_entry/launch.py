"""Spawn torchrun, supervise it, tear it down on failure or stop: the launcher's phases.

launch -> monitor -> teardown -> verdict. The monitor watches four things: torchrun's exit, the
per-rank result records the worker wrappers write, aborts relayed from other hosts, and stop
signals. Whatever ends the job, every worker process group is gone when this returns.

Stop: the bootstrap delivers it on every torch release. torchrun before 2.12 kills the workers
30 s after its own SIGTERM, less than the 100 s a checkpoint may need (SageMaker kills at 120 s),
so torchrun never gets the stop: it runs in a process group of its own (a terminal's or a group
kill's signal does not reach it either), the bootstrap writes the control folder's stop file
(a worker torchrun starts from now on runs nothing), signals every worker group itself, and a
stopped worker wrapper exits 0 (its record keeps the status), so torchrun sees no failure to
answer with a second signal or a restart. torchrun keeps running all along: it hosts the job's
store, which ranks keep polling until they exit (NCCL's heartbeat thread; a rank whose store
host is frozen never exits, docs/gpu.md). Once every local rank is gone (and, on the master,
every other host's) torchrun is ended.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from container_entry import flight_recorder
from container_entry.coordination import Member
from container_entry.failure import USAGE_ERROR, Observed, permanent, summarized
from container_entry.hang import HUNG_EXIT_CODE, PROGRESS_ENV, Activity, hung_text, is_hang
from container_entry.logs import log
from container_entry.plan import Plan
from container_entry.preflight import EXPECTED_GPUS_ENV
from container_entry.records import RankRecord, read_json
from container_entry.stopping import Stop
from container_entry.torchrun import MODULE
from container_entry.worker import CONTROL_ENV, STOP_FILE, locked_write, write_all

POLL_SECONDS = 0.1
CONTROL_ROOT = Path(tempfile.gettempdir()) / "container-entry"


def control_dir(name: str) -> Path:
    """A private folder per launch for what must not be uploaded with output/data: the
    script's command line (it holds the hyperparameters, secrets included) and the workers'
    process ids. `<tmp>/container-entry/<bootstrap pid>-<name>`, so tools in the container
    (and tests) find a live job's workers."""
    CONTROL_ROOT.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = CONTROL_ROOT / f"{os.getpid()}-{name}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    return path


# Once its ranks are gone torchrun has nothing left to do but wait at its exit barrier, in a
# store call that no Python signal handler interrupts until the store answers (up to 300 s:
# measured, a SIGTERM to a process in TCPStore.wait is handled only when the wait times out).
# So it gets this long after its SIGTERM, then SIGKILL.
TORCHRUN_EXIT_SECONDS = 1.0


def children(pid: int) -> list[int]:
    """The live (not yet exited) child processes of `pid`, from /proc. torchrun starts each
    worker wrapper in a session of its own, so each child is its worker's process group."""
    found: list[int] = []
    for tasks in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            found += [int(child) for child in tasks.read_text().split()]
    return [child for child in found if not _exited(child)]


def _exited(pid: int) -> bool:
    """Gone, or a zombie its parent has not reaped yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def child_environment(
    plan: Plan, environ: Mapping[str, str], control: Path | None = None
) -> dict[str, str]:
    """The user's environment plus the plan's additions (which never overwrite user values)."""
    env = dict(environ)
    for name, var in plan.env.items():
        env.setdefault(name, var.value)
    if control is not None:
        env[CONTROL_ENV] = str(control)
    env[EXPECTED_GPUS_ENV] = str(plan.num_gpus)  # read by the preflight only
    return env


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> subprocess.Popen:
    """torchrun as a plain process in a process group of its own (a signal to ours, a
    terminal's Ctrl-C, never reaches it: only the bootstrap signals it), its stderr ours to
    pump (TorchrunOutput)."""
    return subprocess.Popen(
        list(argv), env=dict(env), cwd=cwd, stderr=subprocess.PIPE, process_group=0
    )


# torchrun's interpreter, started early: it imports torch's launcher (most of its start-up),
# then waits for its command line, environment and folder (JSON on the pipe `argv[1]`) and runs
# as `python -m torch.distributed.run` would. EOF without a launch (the bootstrap failed, was
# stopped, or died before it): exit quietly.
_PRESTART = """
import ctypes, json, os, sys
pipe = int(sys.argv[1])
try:  # PR_SET_PDEATHSIG: in a group of its own, so nothing else ends it with the bootstrap
    ctypes.CDLL(None, use_errno=True).prctl(1, 9)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[2]):  # the bootstrap died before that took
    sys.exit(0)
if sys.path and sys.path[0] == "":  # -c's own folder: nothing is imported from the bootstrap's
    del sys.path[0]
import torch.distributed.run as run
chunks = []
while chunk := os.read(pipe, 1 << 16):
    chunks.append(chunk)
os.close(pipe)
if not chunks:
    sys.exit(0)
launch = json.loads(b"".join(chunks))
os.environ.clear()
os.environ.update(launch["env"])
os.chdir(launch["cwd"])
if not getattr(sys.flags, "safe_path", False):  # as `-m` puts it
    sys.path.insert(0, os.getcwd())
sys.argv = [run.__file__, *launch["args"]]
run.main(launch["args"])
"""


class Prestarted:
    """torchrun's interpreter started while the bootstrap still joins the other hosts and
    prepares the code: `import torch` (1.2 s of torchrun's 1.8 s start on a 2-CPU host,
    docs/benchmarks.md) then overlaps that work instead of following it. `launch` hands it the
    plan's command line, the final environment (the join may still change it: hosts sharing a
    machine) and the code folder (it may not exist before the code is fetched); what runs from
    there is exactly `python -m torch.distributed.run ARGS`. `discard` ends it unused."""

    def __init__(self, python: str, env: Mapping[str, str]) -> None:
        read, self._pipe = os.pipe()
        try:
            self.process: subprocess.Popen | None = subprocess.Popen(
                [python, "-c", _PRESTART, str(read), str(os.getpid())],
                env=dict(env),
                stderr=subprocess.PIPE,
                pass_fds=(read,),
                process_group=0,  # as spawn(): only the bootstrap signals torchrun
            )
        except OSError:  # no such Python: the launch reports it as it always has
            self.process = None
            os.close(self._pipe)
        finally:
            os.close(read)
        self._handed = False

    def launch(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> subprocess.Popen:
        """The running torchrun; its Python must be the one this was started with."""
        if self.process is None or list(argv[1:3]) != ["-m", MODULE] or self._handed:
            self.discard()
            return spawn(argv, env, cwd)
        self._handed = True
        message = json.dumps({"args": list(argv[3:]), "env": dict(env), "cwd": cwd}).encode()
        # from a thread: the pipe takes 64 KiB while the import runs, and the monitor must run
        # meanwhile (a stop, a dead torchrun)
        threading.Thread(target=self._send, args=(message,), daemon=True).start()
        return self.process

    def _send(self, message: bytes) -> None:
        with contextlib.suppress(OSError):  # it died: the monitor reports its exit
            write_all(self._pipe, message)
        with contextlib.suppress(OSError):
            os.close(self._pipe)

    def discard(self) -> None:
        """End it if it was never launched (EOF first: it exits on its own once imported)."""
        if self._handed:
            return
        self._handed = True
        with contextlib.suppress(OSError):
            os.close(self._pipe)
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()


def prepare_run_dir(run_dir: Path) -> None:
    """Our own records only: remove a previous run's rank files in this tree, nothing else."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    for pattern in ("rank-*.json", "logs/rank-*.log", "stacks/rank-*.txt", "flight-recorder/*"):
        for stale in run_dir.glob(pattern):
            stale.unlink(missing_ok=True)


def tidy_run_dir(run_dir: Path) -> None:
    """Keep only what helps a user (SageMaker uploads output/data): no empty stack files."""
    for path in run_dir.glob("stacks/rank-*.txt"):
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()
    for folder in ("stacks", flight_recorder.FOLDER):
        with contextlib.suppress(OSError):
            (run_dir / folder).rmdir()  # only when empty


class Workers:
    """The worker processes this host's torchrun started, as their wrappers announced them
    (`<control>/rank-N.pid`); each wrapper and its script share one process group."""

    def __init__(self, control: Path) -> None:
        self.control = control
        self.known: dict[int, dict[str, int]] = {}

    def refresh(self) -> dict[int, dict[str, int]]:
        for path in self.control.glob("rank-*.pid"):
            record = read_json(path)
            if record and record.get("rank") is not None:
                self.known[int(record["rank"])] = record
        return self.known

    def signal(self, sig: signal.Signals, ranks: Sequence[int] | None = None) -> None:
        for rank, record in self.refresh().items():
            if ranks is None or rank in ranks:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(record["wrapper"]), sig)

    def request_stacks(self) -> dict[int, bool]:
        """Ask every live rank to write all its threads' Python stacks (faulthandler on SIGUSR2,
        registered by _site/sitecustomize.py); {rank: whether it was asked}. SIGUSR2's default
        action ends a process, so a rank without that handler (a shell entry script, a Python
        still starting) is never sent it."""
        asked: dict[int, bool] = {}
        for rank, record in self.refresh().items():
            child = int(record["child"])
            asked[rank] = False
            if catches(child, signal.SIGUSR2):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(child, signal.SIGUSR2)
                    asked[rank] = True
        return asked

    def capture_stacks(self, wait: float = 0.5) -> None:
        """Every rank's stacks on disk before it is torn down."""
        if any(self.request_stacks().values()):
            time.sleep(wait)


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has a handler installed for `sig` (its SigCgt mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


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

    TRACEBACK = b"Traceback (most recent call last):"
    CHILD_FAILED = b"ChildFailedError"  # torch.distributed.elastic.multiprocessing.errors
    NO_PARENT_FILE = b"no error file defined for parent"  # @record on torchrun's own main

    def __init__(self, own_prefix: bytes) -> None:
        from container_entry.logs import MASKER  # every secret the plan registered

        self.own = own_prefix
        self.masker = MASKER
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


class Supervisor:
    def __init__(
        self,
        plan: Plan,
        environ: Mapping[str, str],
        run_dir: Path,
        member: Member | None,
        stop: Stop,
        prestarted: Prestarted | None = None,
        peers_running: Callable[[], bool] | None = None,
    ) -> None:
        self.plan = plan
        # the master's: whether another host's bootstrap still runs its ranks (this torchrun
        # hosts the store they may still poll)
        self.peers_running = peers_running
        self.prestarted = prestarted
        self.environ = environ
        self.run_dir = run_dir
        self.member = member
        self.stop = stop
        self.settings = plan.settings
        # with restarts torchrun retries a failed group itself: only its final exit is a failure
        self.restarts = plan.max_restarts
        self.observed = Observed(torch_version=plan.torch_version, restarts=self.restarts)
        self.control = control_dir("job")
        self.workers = Workers(self.control)
        self.signalled: set[int] = set()  # worker groups (wrapper pids) the bootstrap stopped
        self.stopping = False  # delivering a stop: until every rank is gone or the grace ends
        self.waiting_for_peers = False
        self.output = TorchrunOutput(f"[{plan.topology.current_host} rank ".encode())
        self.hang_timeout = self.settings.hang_timeout
        self.activity: Activity | None = None

    def effective(self, name: str) -> str | None:
        """A variable as the workers get it: the user's value, else the plan's."""
        added = self.plan.env.get(name)
        return self.environ.get(name, added.value if added else None)

    # -- launch ---------------------------------------------------------------------------
    def launch(self) -> subprocess.Popen:
        """The script's command line goes to a private file, never through torchrun's parser."""
        prepare_run_dir(self.run_dir)
        job = {
            "argv": list(self.plan.command),
            "preflight": list(self.plan.preflight),  # run first in each rank's slot
            "run_dir": str(self.run_dir),
            "console_ranks": self.settings.console_ranks,
            "secrets": list(self.plan.secrets),
            "console_stderr": self.output.worker_stderr(),
        }
        path = self.control / "command.json"
        path.write_text(json.dumps(job))
        path.chmod(0o600)
        self.stop.raising = False
        if self.hang_timeout:
            self.activity = Activity(self.run_dir, self.effective(PROGRESS_ENV))
            if self.member:  # several hosts: the master decides, from every host's idle time
                self.member.idle = self.activity.idle
        env = child_environment(self.plan, self.environ, self.control)
        if self.prestarted is not None:
            return self.prestarted.launch(self.plan.argv, env, self.plan.code.code_dir)
        return spawn(self.plan.argv, env, self.plan.code.code_dir)

    # -- monitor --------------------------------------------------------------------------
    def _collect(self, final: bool = False) -> None:
        for path in self.run_dir.glob("rank-*.json"):
            data = read_json(path)
            if data and data.get("rank") is not None:
                self.observed.results[int(data["rank"])] = RankRecord.from_json(data)
        self.observed.launched |= set(self.workers.refresh())
        if self.observed.first_failure or self.observed.remote_failure or self.observed.stop_signal:
            return
        if self.observed.hung:  # ranks ending now were stopped by the watchdog
            return
        if self.observed.lost_master:
            return
        failed = [r for r in self.observed.results.values() if r.failed and not r.stop_signal]
        # a failure that would repeat identically is not worth a restart (failure.permanent)
        if failed and (self.restarts == 0 or final or any(map(permanent, failed))):
            self.observed.first_failure = min(failed, key=lambda r: r.ended_at or 0)

    def monitor(self, process: subprocess.Popen) -> None:
        output = self.output
        pump = threading.Thread(target=output.pump, args=(process,), daemon=True)
        pump.start()
        deadline: float | None = None
        seen: tuple[int, ...] = ()  # the two folders' change times at the last scan
        scanned = 0.0
        try:
            with self.stop.wakes_on_child_exit():
                while process.poll() is None:
                    # Scan for records and pid files only when one may have appeared: each is
                    # renamed into its folder, which changes the folder's mtime. That clock is
                    # coarse (two files in one tick leave one mtime), so within 2 s of a change,
                    # and at least once a second, scan anyway.
                    try:
                        stamps = tuple(os.stat(p).st_mtime_ns for p in (self.run_dir, self.control))
                    except OSError:
                        stamps = ()
                    now = time.monotonic()
                    if (
                        stamps != seen
                        or not stamps
                        or time.time_ns() - max(stamps) < 2_000_000_000
                        or now - scanned >= 1.0
                    ):
                        self._collect()
                        seen, scanned = stamps, now
                    if deadline is None:
                        deadline = self._decide_teardown(process, now)
                        self.output.quiet = deadline is not None
                    elif self.stopping:
                        deadline = self._deliver_stop(process, now, deadline)
                    elif now >= deadline:
                        self._force(process)
                        break
                    self.stop.wait(POLL_SECONDS)
                process.wait()
        finally:
            if self.member:
                self.member.idle = None
            self.workers.signal(signal.SIGKILL)  # nothing outlives the launcher
            if process.poll() is None:
                process.kill()
                process.wait()
            pump.join(timeout=2)
            _reap_orphans()
            self._collect(final=True)
            shutil.rmtree(self.control, ignore_errors=True)
            tidy_run_dir(self.run_dir)
        self.observed.returncode = process.returncode
        self.observed.torchrun_tail = list(output.tail)

    def _force(self, process: subprocess.Popen) -> None:
        """The teardown's deadline passed: kill what is left. Ranks still running then are
        the news (stacks first); torchrun slow to exit after its ranks is not."""
        if children(process.pid):
            log("grace period over: recording stacks, killing the remaining workers")
            self.workers.capture_stacks()
            self.observed.forced_kill = True
        self._kill_workers(process)
        process.kill()

    def _kill_workers(self, process: subprocess.Popen) -> None:
        """SIGKILL every worker group: those announced by pid file and torchrun's children
        (a wrapper killed before it wrote its pid file)."""
        self.workers.signal(signal.SIGKILL)
        for wrapper in children(process.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(wrapper, signal.SIGKILL)

    def _deliver_stop(self, process: subprocess.Popen, now: float, deadline: float) -> float:
        """The stop, step by step: every worker group torchrun has gets the signal once (a
        wrapper it starts later finds the stop file and runs nothing); once they are all gone,
        or the grace is over, torchrun is ended. On the master torchrun hosts the job's store,
        so it waits, within the grace, until the other hosts' ranks are gone too."""
        self.observed.launched |= set(self.workers.refresh())
        sig = signal.Signals[self.observed.stop_signal or "SIGTERM"]
        running = children(process.pid)
        for wrapper in running:
            if wrapper not in self.signalled:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(wrapper, sig)
                self.signalled.add(wrapper)
        if running and now < deadline:
            return deadline
        if running:
            self._force(process)
            self.stopping = False
            return now + TORCHRUN_EXIT_SECONDS
        if self.peers_running is not None and now < deadline and self.peers_running():
            if not self.waiting_for_peers:
                log("this host's ranks exited; keeping the job's store up for the other hosts")
                self.waiting_for_peers = True
            return deadline
        self.stopping = False
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)  # no worker left: it only ends
        return now + TORCHRUN_EXIT_SECONDS

    def _decide_teardown(self, process: subprocess.Popen, now: float) -> float | None:
        """Start a teardown when needed; returns its deadline."""
        if self.stop.signal:
            self.observed.stop_signal, self.observed.stop_at = self.stop.signal, self.stop.at
            grace = self.settings.stop_grace_period
            self.observed.grace = grace
            log(f"received {self.stop.signal}: stopping every rank (grace period {grace:g} s)")
            with contextlib.suppress(OSError):  # before any signal: no new worker runs anything
                (self.control / STOP_FILE).write_text(self.stop.signal)
            self.stopping = True
            return self._deliver_stop(process, now, now + grace)
        grace = self.settings.failure_grace_period
        if self.observed.first_failure:
            failure = self.observed.first_failure
            log(
                f"rank {failure.rank} on {failure.host} failed: stopping this host's "
                "workers and telling the other hosts"
            )
            if self.member:
                self.member.post_failure(summarized(failure, self.restarts))
            self.workers.capture_stacks()
            self.observed.grace = grace
            process.send_signal(signal.SIGTERM)
            return now + grace
        if self.member and self.member.aborted.is_set():
            if self.member.lost_master:
                self.observed.lost_master = self.member.master
            elif is_hang(self.member.abort):
                self.observed.hung = self.member.abort
                return self._stop_hung(process, now)
            else:
                self.observed.remote_failure = self.member.abort
            log("another host failed: recording stacks, stopping this host's workers")
            self.workers.capture_stacks()
            self.observed.grace = grace
            process.send_signal(signal.SIGTERM)
            return now + grace
        if self.activity and not self.member and self.activity.idle() >= self.hang_timeout:
            what = hung_text(self.hang_timeout)
            host = self.plan.topology.current_host
            self.observed.hung = RankRecord(
                host=host, rank=None, returncode=HUNG_EXIT_CODE, what=what
            )
            return self._stop_hung(process, now)
        return None

    def _stop_hung(self, process: subprocess.Popen, now: float) -> float:
        """Where every rank is stuck, for the failure file, before the teardown: Python stacks
        (faulthandler dumps even while the main thread waits in native code) and each rank's
        flight-recorder records of its collectives (NCCL's and gloo's), awaited until complete
        (bounded) before any rank is stopped."""
        assert self.observed.hung is not None
        log(f"{self.observed.hung.what}: recording stacks, stopping this host's workers")
        self.workers.capture_stacks(wait=1.0)
        flight_recorder.collect(self.control, self.run_dir, self.workers.refresh())
        self.observed.grace = grace = self.settings.failure_grace_period
        process.send_signal(signal.SIGTERM)
        return now + grace


def _reap_orphans() -> None:
    """As PID 1 we inherit orphaned processes' zombies; collect them."""
    if os.getpid() != 1:
        return
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
