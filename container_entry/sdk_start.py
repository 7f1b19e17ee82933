"""`container-entry sagemaker-sdk STOP SHELL -c STRING`: SDK v3's start, handed over by the hook.

docker/sdk-hook.bash runs this in place of the PID 1 bash that SageMaker SDK v3 starts
(`ModelTrainer` with `source_code`), with the shell's own argv and the stop signal it noted
before the exec, if any. `sdk_driver.judge` judges the SDK's files: our launcher takes the job
over (`train`, with the SDK's entry script, hyperparameters, requirements and SM_* variables),
or the SDK's start runs as it is, as a child of ours, so that a stop still reaches it (PID 1
bash would drop it).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Mapping, Sequence

from container_entry.common import stopping
from container_entry.common.logs import log
from container_entry.plan import sdk_driver
from container_entry.plan.environment import base_dir_from
from container_entry.supervise import unchanged
from container_entry.supervise.outcome import Outcome

STOP_GRACE_DEFAULT = 100.0


def judged(shell_argv: Sequence[str], environ: Mapping[str, str]) -> sdk_driver.Decision:
    """The SDK's files as they are here, judged; reading never fails (what cannot be read is
    a layout this release does not know, or the plan's to report)."""
    from container_entry.plan.environment import read_config

    base = base_dir_from(environ)
    hyperparameters: dict = {}
    with contextlib.suppress(Exception):
        hyperparameters = read_config(base / "input" / "config" / "hyperparameters.json")
    return sdk_driver.judge(
        shell_argv,
        sdk_driver.read_files(base),
        base,
        opted_out=sdk_driver.opted_out(environ, hyperparameters),
    )


def _number(name: str | None) -> int:
    """A stop signal's number from its name (Stop keeps names)."""
    return int(getattr(signal, name or "SIGTERM", signal.SIGTERM))


def _grace(environ: Mapping[str, str]) -> float:
    """STOP_GRACE_PERIOD as the settings give it; the default where they cannot be read."""
    from container_entry.plan import settings

    with contextlib.suppress(Exception):
        return settings.resolve(environ, {}).stop_grace_period
    return STOP_GRACE_DEFAULT


def run_unchanged(shell_argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """The SDK's start exactly as it would have run, under our stop (supervise/unchanged.py)."""
    stop = stopping.Stop()
    stop.workers_started()  # never raised: every stop is the child's to answer
    stop.install()
    outcome = Outcome(base_dir_from(environ))
    return unchanged.run_unchanged(
        shell_argv, environ, stop, outcome, _grace(environ), "the SDK's start"
    )


def handed_over(args: Sequence[str], environ: Mapping[str, str]) -> sdk_driver.Decision:
    """`STOP SHELL -c STRING` from the hook: the stop its shell noted, if any, is noted here as
    if it had come now; the SDK's start is judged, and the verdict said in one line."""
    stopped = args[0] if args else ""
    if stopped in {s.name for s in stopping.STOP_SIGNALS}:
        stopping.note_early(_number(stopped))
    decision = judged(args[1:], environ)
    log(decision.why)
    return decision
