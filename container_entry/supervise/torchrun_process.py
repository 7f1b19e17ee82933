"""The environment torchrun and its workers get (starting torchrun: prestart.py)."""

from __future__ import annotations

from collections.abc import Mapping

from container_entry.common.layout import CONTROL_ENV, ControlDir
from container_entry.plan.plan import Plan
from container_entry.rank.preflight import EXPECTED_GPUS_ENV


def child_environment(
    plan: Plan, environ: Mapping[str, str], control: ControlDir | None = None
) -> dict[str, str]:
    """The user's environment plus the plan's additions (which never overwrite user values)."""
    env = dict(environ)
    for name, var in plan.env.items():
        env.setdefault(name, var.value)
    if control is not None:
        env[CONTROL_ENV] = str(control.path)
    env[EXPECTED_GPUS_ENV] = str(plan.num_gpus)  # read by the preflight only
    return env
