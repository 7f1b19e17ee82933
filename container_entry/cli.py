"""Commands: `train` (launch), `plan` (dry run, JSON), anything else runs as given.

`container-entry` is the image's ENTRYPOINT: no arguments or `train` starts training (what
SageMaker and SDK v3 local mode run), `plan` prints the plan, any other command (`bash`,
`python -c ...`) is exec'd unchanged, as the DLC's entrypoint does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from container_entry import code, launch, network
from container_entry.environment import base_dir_from, read_environment
from container_entry.errors import BootstrapError
from container_entry.failure import Outcome, container_exit_code, describe_exit
from container_entry.logs import log, register_secrets
from container_entry.plan import Plan, build_plan

USAGE = """usage: container-entry [train [SCRIPT [ARGS...]] | plan [SCRIPT [ARGS...]] | COMMAND...]

  train   resolve the plan, fetch code, launch one DDP worker per GPU via torchrun (default)
  plan    print the launch plan as JSON and exit, launching nothing
  COMMAND anything else runs unchanged (bash, python -c ..., ...)
"""


def _resolve(cli_args: Sequence[str]) -> Plan:
    env = read_environment(cli_args=cli_args)
    register_secrets(env.environ, env.hyperparameters.items())
    return build_plan(env)


def plan_command(cli_args: Sequence[str]) -> int:
    try:
        plan = _resolve(cli_args)
    except BootstrapError as error:
        log(f"error: {error}")
        return error.exit_code
    print(plan.to_json(), flush=True)
    return 0


def train(cli_args: Sequence[str]) -> int:
    """Resolve, prepare, launch; every outcome leaves a success or failure file."""
    environ = dict(os.environ)
    base = base_dir_from(environ)
    outcome = Outcome(base)
    try:
        plan = _resolve(cli_args)
        log("plan\n" + plan.summary())
        if len(plan.hosts) > 1:
            network.wait_for_hosts(plan.hosts, float(plan.settings["host_wait_timeout"]))
        code.prepare(plan, environ)
        code.install_requirements(plan, plan.argv[0])
        for directory in (base / "model", base / "output" / "data"):
            directory.mkdir(parents=True, exist_ok=True)
    except BootstrapError as error:
        log(f"error: {error}")
        outcome.failure(f"{type(error).__name__}: {error}")
        return error.exit_code
    except OSError as error:
        log(f"error: {error}")
        outcome.failure(f"OSError: {error}")
        return 2
    status = launch.run(plan, environ)
    if status == 0:
        log("training finished: all workers exited 0")
        outcome.success()
        return 0
    message = f"training failed on host {plan.current_host}: torchrun {describe_exit(status)}"
    log(message)
    outcome.failure(message)
    return container_exit_code(status)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] == "train":
        return train(args[1:])
    if args[0] == "plan":
        return plan_command(args[1:])
    if args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    try:
        os.execvp(args[0], args)
    except OSError as error:
        log(f"error: cannot run {args[0]!r}: {error.strerror}")
        return 127
    return 0  # pragma: no cover - execvp does not return


def train_main() -> int:
    """The `train` console script: what SageMaker runs."""
    return train(sys.argv[1:])
