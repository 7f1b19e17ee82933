"""Commands: `train` (launch), `plan` (dry run, JSON), anything else runs as given.

`container-entry` is the image's ENTRYPOINT: no arguments or `train` starts training (what
SageMaker and SDK v3 local mode run), `plan` prints the plan, any other command (`bash`,
`python -c ...`) is exec'd unchanged, as the DLC's entrypoint does. No traceback ever reaches
the user: an unexpected exception becomes one line, a failure file and exit code 70; a stop
(SIGINT, SIGTERM, SIGHUP) from the first line of this module on is a stopped job (128+N).
What the bootstrap prints is valid UTF-8 whatever names it holds (text.ESCAPE).
"""

from __future__ import annotations

# Few imports up front: the console scripts (`console_main`, `train_main`) and `python -m`
# (__main__.py) note the stop signals first thing (stopping.record_early), so a stop in the
# first moments of the container is neither a KeyboardInterrupt traceback nor lost (as PID 1, a
# signal without a handler is ignored). Everything else is imported where it is used.
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from container_entry.common import stopping
from container_entry.common.errors import StopRequested
from container_entry.common.exits import ExitCode
from container_entry.common.stopping import Stop
from container_entry.common.text import escaped, register

if TYPE_CHECKING:
    from container_entry.plan.sdk_driver import SdkJob

SDK_COMMAND = "sagemaker-sdk"  # what docker/sdk-hook.bash runs

USAGE = """usage: container-entry [train [SCRIPT [ARGS...]] | plan [SCRIPT [ARGS...]]
                       | stacks | stragglers | sagemaker-sdk ... | CMD...]

  train   resolve the plan, fetch code, launch one DDP worker per GPU via torchrun (default)
  plan    print the launch plan as JSON and exit, launching nothing (exit 2 with `problems`)
  stacks  inside a running container: every local rank's Python stacks, nothing stopped
  stragglers  inside a running container (the master host): the last straggler table
  sagemaker-sdk  SageMaker SDK v3's own start (ModelTrainer with source_code), handed over by
          the image's bash hook: our launcher runs its entry script
  CMD     anything else runs unchanged (bash, python -c ..., ...)

Settings: environment variable CONTAINER_ENTRY_<NAME> or hyperparameter container_entry_<name>
"""


def usage() -> str:
    from container_entry.plan import settings

    rows = [f"  {name:<21} {default:<6} {doc}" for name, default, doc in settings.table()]
    return USAGE + "\n".join(rows).replace("`", "") + "\n"


def plan_command(cli_args: Sequence[str]) -> int:
    """Everything that could be resolved, as JSON; `problems` lists what stops a launch."""
    import json

    from container_entry.common.errors import BootstrapError
    from container_entry.common.logs import log
    from container_entry.job import resolve

    try:
        plan = resolve(cli_args)
    except BootstrapError as error:
        log(f"error: {error}")
        print(json.dumps({"problems": [str(error)]}, indent=2), flush=True)
        return error.exit_code
    print(plan.to_json(), flush=True)
    for problem in plan.problems:
        log(f"problem: {problem}")
    return ExitCode.BAD_INPUT if plan.problems else ExitCode.SUCCESS


def _internal_error(command: str, error: BaseException) -> int:
    """The last resort: one line, the traceback in the run folder, a failure file (train)."""
    import time
    import traceback

    from container_entry.common.layout import RunDir
    from container_entry.common.logs import log, masked_text
    from container_entry.diagnose.failure import internal_words, traceback_line
    from container_entry.plan.environment import base_dir_from
    from container_entry.supervise.ending import Verdict
    from container_entry.supervise.outcome import Outcome

    environ = dict(os.environ)
    what = internal_words(error)
    folder = RunDir.of(base_dir_from(environ))
    path = folder.internal_error(int(time.time()))
    with contextlib.suppress(OSError):
        folder.path.mkdir(parents=True, exist_ok=True)
        text = masked_text("".join(traceback.format_exception(error)))  # uploaded with the output
        path.write_text(text, encoding="utf-8", errors=register())
    shown = escaped(str(path))
    log(f"{what} (a defect of container-entry; traceback in {shown})")
    if command == "train":
        verdict = Verdict(ExitCode.INTERNAL, what, [traceback_line(shown)])
        return Outcome(base_dir_from(environ)).write(verdict)
    return ExitCode.INTERNAL


def _stopped(stop: StopRequested) -> int:
    """A stop before train() could take over its own reporting: one line, a failure file."""
    from container_entry.diagnose.failure import stopped_line
    from container_entry.plan.environment import base_dir_from
    from container_entry.supervise.ending import Verdict
    from container_entry.supervise.outcome import Outcome

    print(f"[container-entry] {stop}", file=sys.stderr, flush=True)
    verdict = Verdict(stop.exit_code, stopped_line(str(stop)), [])
    return Outcome(base_dir_from(os.environ)).write(verdict)


def _guarded(
    command: str,
    run: Callable[[Sequence[str]], int],
    args: Sequence[str],
    stop: Stop | None = None,
) -> int:
    try:
        return run(args)
    except StopRequested as stopped:
        if stop is not None:
            stop.reporting()  # a second signal must not interrupt the report
        return _stopped(stopped)
    except KeyboardInterrupt:  # SIGINT under Python's own handler (not `train`'s)
        if stop is None:
            raise
        stop.reporting()
        return _stopped(StopRequested("stopped by SIGINT before the workers started", "SIGINT"))
    except SystemExit:
        raise
    except BaseException as error:
        if stop is not None:
            stop.reporting()
            if stop.cut_start:  # the stop's own exception, as the code it cut reshaped it
                return _stopped(stop.requested())
        return _internal_error(command, error)


def _safe_output() -> None:
    """stdout and stderr never fail on a name that is not UTF-8: `\\xNN` instead."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors=register())  # type: ignore[union-attr]


def train_command(cli_args: Sequence[str], sdk: SdkJob | None = None) -> int:
    """`train`: resolve, join, prepare, launch; `sdk`: the SDK v3 job the hook handed over."""
    stop = Stop()

    def train(args: Sequence[str]) -> int:
        # torchrun's interpreter first, before our own imports and the plan: its import of torch
        # is the longest step on the way to the first all_reduce (supervise/prestart.py)
        from container_entry.supervise.prestart import Prestarted, start_environment

        torchrun = Prestarted(sys.executable, start_environment(os.environ))
        try:
            from container_entry.plan.sdk_driver import drop_image_bash_env

            drop_image_bash_env(os.environ)  # (a Python reads no BASH_ENV: torchrun's is moot)
            # imported while a stop is only noted: raised inside an import, it was reshaped by
            # the code it cut (`Error calling __set_name__`, a half-imported module)
            from container_entry.job import train

            stop.install()  # takes over from record_early: a stop noted there raises here
            stop.check()
            return train(args, stop, torchrun, sdk=sdk)
        finally:
            torchrun.discard()  # never launched (a failure, a stop, a dry run): ended

    return _guarded("train", train, cli_args, stop)


def sdk_command(args: Sequence[str]) -> int:
    """SageMaker SDK v3's own start (`ModelTrainer` with `source_code`), handed over by the
    image's bash hook as `STOP SHELL -c STRING`: trained by our launcher, or run as it is."""
    from container_entry import sdk_start

    decision = sdk_start.handed_over(args, os.environ)
    if decision.job is not None:
        return train_command([], sdk=decision.job)
    shell = list(args[1:])
    return _guarded("train", lambda argv: sdk_start.run_unchanged(argv, os.environ), shell)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    _safe_output()
    if not args or args[0] == "train":
        return train_command(args[1:])  # torchrun's interpreter first, then the rest
    from container_entry.plan.sdk_driver import drop_image_bash_env

    drop_image_bash_env(os.environ)
    if args[0] == SDK_COMMAND:
        return sdk_command(args[1:])
    stopping.release_early()  # not training: the stop signals as they were
    if args[0] == "plan":
        return _guarded("plan", plan_command, args[1:])
    if args[0] == "stacks":
        from container_entry.diagnose.stacks import print_live_stacks

        return print_live_stacks()
    if args[0] == "stragglers":
        from container_entry.supervise.straggler_watch import print_table

        return print_table()
    if args[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return ExitCode.SUCCESS
    with contextlib.suppress(OSError):
        os.execvp(args[0], args)
    print(
        f"[container-entry] error: cannot run {args[0]!r}: not found or not executable",
        file=sys.stderr,
    )
    return ExitCode.NOT_FOUND


def console_main() -> int:
    """The `container-entry` console script, the image's entrypoint."""
    stopping.record_early()
    return main()


def train_main() -> int:
    """The `train` console script: what SageMaker runs."""
    stopping.record_early()
    return main(["train", *sys.argv[1:]])
