"""Commands: `train` (launch), `plan` (dry run, JSON), anything else runs as given.

`container-entry` is the image's ENTRYPOINT: no arguments or `train` starts training (what
SageMaker and SDK v3 local mode run), `plan` prints the plan, any other command (`bash`,
`python -c ...`) is exec'd unchanged, as the DLC's entrypoint does. No traceback ever reaches
the user: an unexpected exception becomes one line, a failure file and exit code 70.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence

# Only the stop handler is imported up front: `train` installs it before anything else loads,
# so a stop in the first moments of the container is not lost (as PID 1, a signal without a
# handler is ignored). Everything else is imported where it is used.
from container_entry.errors import StopRequested
from container_entry.stopping import Stop

USAGE = """usage: container-entry [train [SCRIPT [ARGS...]] | plan [SCRIPT [ARGS...]]
                       | stacks | CMD...]

  train   resolve the plan, fetch code, launch one DDP worker per GPU via torchrun (default)
  plan    print the launch plan as JSON and exit, launching nothing (exit 2 with `problems`)
  stacks  inside a running container: every local rank's Python stacks, nothing stopped
  CMD     anything else runs unchanged (bash, python -c ..., ...)

Settings: environment variable CONTAINER_ENTRY_<NAME> or hyperparameter container_entry_<name>
"""


def usage() -> str:
    from container_entry import settings

    rows = [f"  {name:<21} {default:<6} {doc}" for name, default, doc in settings.table()]
    return USAGE + "\n".join(rows).replace("`", "") + "\n"


def plan_command(cli_args: Sequence[str]) -> int:
    """Everything that could be resolved, as JSON; `problems` lists what stops a launch."""
    import json

    from container_entry.errors import BootstrapError
    from container_entry.job import resolve
    from container_entry.logs import log

    try:
        plan = resolve(cli_args)
    except BootstrapError as error:
        log(f"error: {error}")
        print(json.dumps({"problems": [str(error)]}, indent=2), flush=True)
        return error.exit_code
    print(plan.to_json(), flush=True)
    for problem in plan.problems:
        log(f"problem: {problem}")
    return 2 if plan.problems else 0


def _internal_error(command: str, error: BaseException) -> int:
    """The last resort: one line, the traceback in the run folder, a failure file (train)."""
    import time
    import traceback

    from container_entry.environment import base_dir_from
    from container_entry.failure import INTERNAL_EXIT_CODE, Outcome
    from container_entry.logs import log
    from container_entry.plan import run_dir

    environ = dict(os.environ)
    what = f"internal error: {type(error).__name__}: {error}"
    folder = run_dir(base_dir_from(environ))
    path = folder / f"internal-error-{int(time.time())}.txt"
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(traceback.format_exception(error)))
    log(f"{what} (a defect of container-entry; traceback in {path})")
    if command == "train":
        Outcome(base_dir_from(environ)).failure(what, [f"traceback: {path}"])
    return INTERNAL_EXIT_CODE


def _guarded(command: str, run: Callable[[Sequence[str]], int], args: Sequence[str]) -> int:
    try:
        return run(args)
    except StopRequested as stop:  # before train() could take over its own reporting
        from container_entry.environment import base_dir_from
        from container_entry.failure import Outcome

        print(f"[container-entry] {stop}", file=sys.stderr, flush=True)
        Outcome(base_dir_from(os.environ)).failure(f"StopRequested: {stop}")
        return stop.exit_code
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:
        return _internal_error(command, error)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] == "train":
        stop = Stop()
        stop.install()

        def train(cli_args: Sequence[str]) -> int:
            from container_entry.job import train

            return train(cli_args, stop)

        return _guarded("train", train, args[1:])
    if args[0] == "plan":
        return _guarded("plan", plan_command, args[1:])
    if args[0] == "stacks":
        from container_entry.stacks import print_live_stacks

        return print_live_stacks()
    if args[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return 0
    with contextlib.suppress(OSError):
        os.execvp(args[0], args)
    print(
        f"[container-entry] error: cannot run {args[0]!r}: not found or not executable",
        file=sys.stderr,
    )
    return 127


def train_main() -> int:
    """The `train` console script: what SageMaker runs."""
    return main(["train", *sys.argv[1:]])
