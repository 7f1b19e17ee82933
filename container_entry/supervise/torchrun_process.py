"""The environment torchrun and its workers get (starting torchrun: prestart.py)."""

from __future__ import annotations

from collections.abc import Mapping

from container_entry.common.layout import CONTROL_ENV, ControlDir
from container_entry.plan.plan import Plan
from container_entry.rank.preflight import EXPECTED_GPUS_ENV


def script_environment(plan: Plan, environ: Mapping[str, str]) -> dict[str, str]:
    """What the script gets: the user's environment plus the plan's additions (which never
    overwrite user values)."""
    env = dict(environ)
    for name, var in plan.env.items():
        env.setdefault(name, var.value)
    return env


def child_environment(
    plan: Plan, environ: Mapping[str, str], control: ControlDir | None = None
) -> dict[str, str]:
    """torchrun's: the script's environment and the launch's own variables. An entry point
    that runs once gets its environment through the command record instead; the PET_*
    variables are then its own launcher's and never steer ours."""
    env = script_environment(plan, environ)
    if plan.once:
        env = {name: value for name, value in env.items() if not name.startswith("PET_")}
    if control is not None:
        env[CONTROL_ENV] = str(control.path)
    env[EXPECTED_GPUS_ENV] = str(plan.num_gpus)  # read by the preflight only
    return env
