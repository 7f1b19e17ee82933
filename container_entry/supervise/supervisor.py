"""One host's launch, supervised: torchrun handed its command, the run watched, the ranks taken
down the way its ending needs, and what the run left gathered for the verdict.

launch -> look -> ending_of (ending.py) -> teardown (teardown.py) -> Observed. Each look reads the
ranks' records and pid files (only when a folder changed), the master's word and the stop
signals; `ending_of` names the ending as soon as there is one, and the teardown for it starts.
Whatever ends the job, every worker process group is gone when `monitor` returns.

Stop: the bootstrap delivers it on every torch release. torchrun before 2.12 kills the workers
30 s after its own SIGTERM, less than the 100 s a checkpoint may need (SageMaker kills at 120 s),
so torchrun never gets the stop: it runs in a process group of its own, the bootstrap writes the
control folder's stop file (a worker torchrun starts from now on runs nothing), signals every
worker group itself, and a stopped worker wrapper exits 0 (its record keeps the status), so
torchrun sees no failure to answer with a second signal or a restart. torchrun keeps running all
along: it hosts the job's store, which ranks keep polling until they exit (NCCL's heartbeat
thread; a rank whose store host is frozen never exits, docs/gpu.md). Once every local rank is
gone (and, on the master, every other host's) torchrun is ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from container_entry.common.layout import ControlDir, RunDir
from container_entry.common.logs import log
from container_entry.common.records import Command, RankRecord, read_json, shown_ranks
from container_entry.common.stopping import Stop, StopSignal
from container_entry.common.workers import Workers, childless, reap_orphans
from container_entry.diagnose import culprit, gpu_memory
from container_entry.diagnose.failure import (
    failed_one,
    is_collective_timeout,
    is_cuda_oom,
    summarized,
    words,
)
from container_entry.diagnose.hang import PROGRESS_ENV, Activity
from container_entry.hosts.session import Session
from container_entry.plan.plan import Plan
from container_entry.supervise.agreement import agreed
from container_entry.supervise.ending import (
    Ending,
    EndingKind,
    Observed,
    Seen,
    Verdict,
    ending_of,
    stop_cut_a_script,
    stopped_words,
    verdict,
)
from container_entry.supervise.prestart import Prestarted
from container_entry.supervise.straggler_watch import FR_SIZES, StragglerWatch, off_because
from container_entry.supervise.teardown import Hanging, Stopping, Teardown, Winding
from container_entry.supervise.torchrun_output import TorchrunOutput
from container_entry.supervise.torchrun_process import child_environment, script_environment

POLL_SECONDS = 0.1


class Supervisor:
    def __init__(
        self,
        plan: Plan,
        environ: Mapping[str, str],
        run_dir: RunDir,
        session: Session,
        stop: Stop,
        prestarted: Prestarted | None = None,
    ) -> None:
        self.plan = plan
        self.environ = environ
        self.run_dir = run_dir
        self.session = session  # the side channel (one host: nothing to ask of it)
        self.stop = stop
        self.prestarted = prestarted
        self.torchrun_pid: int | None = None  # once launched (torchrun_starting)
        # the master's: whether another host's bootstrap still runs its ranks (this torchrun
        # hosts the store they may still poll)
        self.peers_running = session.peers_running()
        self.settings = plan.settings
        self.control = ControlDir.create("job")
        self.workers = Workers(self.control)
        self.output = TorchrunOutput(f"[{plan.topology.current_host} rank ".encode())
        # with restarts torchrun retries a failed group itself: only its final exit is a failure
        self.observed = Observed(torch_version=plan.torch_version, restarts=plan.max_restarts)
        self.activity: Activity | None = None
        self.watch: StragglerWatch | None = None
        self.ending: Ending | None = None
        self._stamps: tuple[int, ...] = ()  # the two folders' change times at the last scan
        self._scanned = 0.0

    def run(self) -> tuple[Ending, Verdict]:
        """The run, to its end: this host's final ending, the job's first failure agreed across
        hosts included (agreement.py), and the verdict it becomes."""
        ending = self.before_launch() or self.monitor(self.launch())
        if self.watch is not None:
            self.watch.finish()
        host, restarts = self.plan.topology.current_host, self.plan.max_restarts
        ending = agreed(ending, self.observed, self.session, host, self.run_dir, restarts)
        return ending, verdict(ending, self.observed, host, self.run_dir)

    def before_launch(self) -> Ending | None:
        """A peer failed, or the master went away, while this host prepared."""
        if not self.session.interrupted():
            return None
        self.ending = ending_of(self.seen(exited=False))
        return self.ending

    # -- launch ---------------------------------------------------------------------------
    def launch(self) -> subprocess.Popen:
        """The script's command line goes to a private file, never through torchrun's parser."""
        self.run_dir.prepare()
        Command(
            argv=tuple(self.plan.command),
            run_dir=str(self.run_dir.path),
            preflight=tuple(self.plan.preflight),  # run first in each rank's slot
            console_ranks=shown_ranks(self.settings.console_ranks),
            secrets=tuple(self.plan.secrets),
            console_stderr=self.output.worker_stderr(),
            group_teardown_seconds=self.settings.group_teardown_timeout,
            sh_fallback=self.plan.sdk is not None,
            once_env=script_environment(self.plan, self.environ) if self.plan.once else None,
        ).write(self.control.command)
        self.stop.workers_started()
        timeout = self.settings.hang_timeout  # None: auto, which watches several hosts only
        if timeout or (timeout is None and self.session.coordinated):
            progress = self._effective(PROGRESS_ENV)
            activity = self.activity = Activity(
                self.run_dir, progress, self.control.started, self.torchrun_starting
            )
            # several hosts: the master decides, from every host's idle time
            self.session.report_idle(activity.idle if timeout else activity.idle_since_printing)
        self.watch = self._straggler_watch()
        env = child_environment(self.plan, self.environ, self.control)
        assert self.prestarted is not None, "the cli starts torchrun before the plan"
        ready = str(self.control.torchrun_ready)
        process = self.prestarted.launch(self.plan.argv, env, self.plan.code.code_dir, ready)
        self.torchrun_pid = process.pid
        return process

    def _straggler_watch(self) -> StragglerWatch | None:
        """Every multi-rank world of our workers, unless STRAGGLER_INTERVAL is 0; a world the
        side channel's master is not in has no one to line it up (the job's other worlds)."""
        plan, interval = self.plan, self.settings.straggler_interval
        topology = plan.topology
        if not interval or plan.once or (len(topology.world) < 2 and plan.workers < 2):
            return None
        if self.session.coordinated and topology.coordinator not in topology.world:
            return None
        why = off_because({name: self._effective(name) for name in FR_SIZES})
        if why:
            log(f"straggler detection is off: {why}")
            return None
        host = topology.current_host
        gpus = plan.num_gpus > 0
        peers = frozenset(topology.world) - {host}
        where = (self.control, self.run_dir, self.session)
        watch = StragglerWatch(interval, host, gpus, *where, peers=peers)
        watch.start()
        return watch

    def torchrun_starting(self) -> bool:
        """torchrun runs and has started no worker yet: its import of torch, its rendezvous,
        the gap between a restart's groups (from /proc: no wait, no reaping, safe from the side
        channel's thread). That is no script's silence."""
        return self.torchrun_pid is not None and childless(self.torchrun_pid)

    def _effective(self, name: str) -> str | None:
        """A variable as the workers get it: the user's value, else the plan's."""
        added = self.plan.env.get(name)
        return self.environ.get(name, added.value if added else None)

    # -- monitor --------------------------------------------------------------------------
    def monitor(self, process: subprocess.Popen) -> Ending:
        """Watch until torchrun exits: ending_of, tear down, force at the teardown's deadline."""
        pump = threading.Thread(target=self.output.pump, args=(process,), daemon=True)
        pump.start()
        teardown: Teardown | None = None
        try:
            with self.stop.wakes_on_child_exit():
                while process.poll() is None:
                    now = time.monotonic()
                    self.look(now)
                    if teardown is None:
                        teardown = self.begin(process, now)
                    elif now >= teardown.deadline:
                        teardown.force()
                        break
                    else:
                        teardown.step(now)
                    self.stop.wait(POLL_SECONDS)
                process.wait()
        finally:
            self.clean_up(process, pump)
        self.observed.returncode = process.returncode
        self.observed.torchrun_tail = list(self.output.tail)
        if self.ending is None:  # torchrun exited on its own: its restarts are over
            self.ending = ending_of(self.seen(exited=True))
            if self.ending is not None:  # a stop now, with nothing left to stop: which, when
                self._note_the_stop(self.ending)
        assert self.ending is not None  # ending_of always names an ending once torchrun exited
        return self.ending

    def look(self, now: float, *, always: bool = False) -> None:
        """The ranks' records and pid files, read when one may have appeared: each is renamed
        into its folder, which changes the folder's mtime. That clock is coarse (two files in
        one tick leave one mtime), so within 2 s of a change, and once a second, read anyway."""
        try:
            stamps = tuple(os.stat(p).st_mtime_ns for p in (self.run_dir.path, self.control.path))
        except OSError:
            stamps = ()
        recent = bool(stamps) and time.time_ns() - max(stamps) < 2_000_000_000
        if always or stamps != self._stamps or not stamps or recent or now - self._scanned >= 1:
            for path in self.run_dir.records():
                data = read_json(path)
                if data and data.get("rank") is not None:
                    self.observed.results[int(data["rank"])] = RankRecord.from_json(data)
            self.observed.launched |= set(self.workers.refresh())
            self._stamps, self._scanned = stamps, now

    def seen(self, *, exited: bool) -> Seen:
        """What this look shows, for `ending_of`."""
        failures = [r for r in self.observed.results.values() if r.failed_on_its_own]
        # one host: its own watchdog
        alone = self.activity is not None and not self.session.coordinated
        return Seen(
            stop=self.stop.came,
            failures=tuple(failures),
            restarts=self.plan.max_restarts,
            exited=exited,
            returncode=self.observed.returncode,
            lost_master=self.session.lost_master(),
            relayed=self.session.relayed(),
            idle=self.activity.idle() if alone and self.activity else None,
            hang_timeout=self.settings.hang_timeout or 0.0,  # one host: auto is off
            host=self.plan.topology.current_host,
        )

    def begin(self, process: subprocess.Popen, now: float) -> Teardown | None:
        """The teardown for the ending this look shows, started; None while there is none."""
        ending = ending_of(self.seen(exited=False))
        if ending is None:
            return None
        self.ending = ending
        if self.watch is not None:  # no sample's dumps beside the teardown's
            self.watch.close()
        self.output.quiet = True  # from now on torchrun only acknowledges our signals
        teardown = self.teardown_for(ending, process)
        teardown.start(now)
        return teardown

    def teardown_for(self, ending: Ending, process: subprocess.Popen) -> Teardown:
        parts = (process, self.workers, self.observed)
        grace = self.settings.failure_grace_period
        record = ending.record
        if ending.kind in (EndingKind.STOPPED, EndingKind.PEER_STOPPED):
            self._note_the_stop(ending)
            grace = self.settings.stop_grace_period
            cause = words(record) if ending.kind is EndingKind.PEER_STOPPED and record else None
            once = self.plan.once
            return Stopping(*parts, grace, self.control, self.peers_running, cause, once)
        if ending.kind is EndingKind.HUNG:
            assert record is not None
            message = f"{record.what}: recording stacks, stopping this host's workers"
            return Hanging(*parts, grace, message, self.control, self.run_dir, self._sharer())
        if ending.kind is EndingKind.FAILED:
            assert record is not None
            record = self._with_gpu_memory(record)
            self.ending = Ending(EndingKind.FAILED, record)
            message = (
                f"{failed_one(record)} on {record.host} failed: stopping this host's workers "
                "and telling the other hosts"
            )
            tell = self._teller(record)
            if is_collective_timeout(record):  # the records name whom it waited for
                where = (self.control, self.run_dir, self._sharer())
                return Hanging(*parts, grace, message, *where, tell=tell)
            return Winding(*parts, grace, message, tell)
        if ending.kind is EndingKind.LOST_MASTER:
            message = f"lost the master host {ending.master}: recording stacks, stopping"
            return Winding(*parts, grace, message)
        message = "another host failed: recording stacks, stopping this host's workers"
        if record is not None and is_collective_timeout(record):
            return Hanging(*parts, grace, message, self.control, self.run_dir, self._sharer())
        return Winding(*parts, grace, message)

    def _with_gpu_memory(self, record: RankRecord) -> RankRecord:
        """A CUDA out-of-memory failure with who holds that GPU's memory, asked now, while
        the other ranks (and their contexts) still run."""
        text = "\n".join([str(record.exception or ""), *record.stderr_tail])
        if not self.plan.num_gpus or not is_cuda_oom(text):
            return record
        gpu = gpu_memory.oom_device(text, self._effective("CUDA_VISIBLE_DEVICES"))
        if gpu is None or record.rank is None:
            return record
        try:
            found = gpu_memory.holders(gpu, self.workers.refresh())
        except (OSError, subprocess.SubprocessError, ValueError) as error:
            log(f"could not ask the driver who holds GPU {gpu}'s memory: {error}")
            return record
        line = gpu_memory.report(gpu, self.plan.topology.current_host, record.rank, found)
        words_now = words(record, self.plan.max_restarts)
        return replace(record, summary=f"{words_now}; {line}")

    def _sharer(self) -> Callable[[], None] | None:
        """Several hosts: this host's ranks' records to the master, which lines up every
        host's for the hang's culprit (one host analyses its own: job.py); then its word,
        before any rank here is ended. Ending them first would end the other hosts' ranks
        inside the collective (their peers closed the connection, or NCCL aborted) before
        those hosts had asked them for their records and stacks: the hosts hear the verdict
        at different moments, and each is as slow as its machine."""
        session = self.session
        if not session.coordinated:
            return None
        host = self.plan.topology.current_host

        def share() -> None:
            session.share_records(culprit.local_ranks(self.run_dir, host))

        return share

    def _note_the_stop(self, ending: Ending) -> None:
        """A stop's ending: which stop this host's ranks get, and from when (the verdict says
        whether it came after every script ended): its own signal; or another host's
        (PEER_STOPPED), as its word arrived. Its own, where it cuts a running script, is told
        to the other hosts with its moment before any rank here is signalled
        (ending.stop_cut_a_script)."""
        observed, session = self.observed, self.session
        relayed = ending.record if ending.kind is EndingKind.PEER_STOPPED else None
        if ending.kind is not EndingKind.STOPPED and relayed is None:
            return
        if relayed is not None:
            name = relayed.stop.name if relayed.stop else "SIGTERM"  # its ranks get this now
            observed.stop = StopSignal(name, session.relayed_at() or time.time())
            return
        observed.stop = self.stop.came
        ended = {r for r in observed.launched if self.control.exiting(r).exists()}
        if not session.coordinated or not stop_cut_a_script(observed, ended):
            return
        came = self.stop.came
        assert came is not None  # a STOPPED ending: the handler noted it
        what = stopped_words(came, self.plan.topology.current_host)
        session.post(session.host_failure(what, came.exit_code, came))

    def _teller(self, record: RankRecord) -> Callable[[], None] | None:
        if not self.session.coordinated:
            return None
        return lambda: self.session.post(summarized(record, self.plan.max_restarts))

    def clean_up(self, process: subprocess.Popen, pump: threading.Thread) -> None:
        """Nothing outlives the launcher; the last records read; the control folder gone."""
        self.session.report_idle(None)
        self.workers.signal(signal.SIGKILL)
        if process.poll() is None:
            process.kill()
            process.wait()
        pump.join(timeout=2)
        self.workers.wait_gone()
        reap_orphans()
        self.look(time.monotonic(), always=True)
        self.control.remove()
        self.run_dir.tidy()
