"""Results as markdown tables, and the page's generated block rewritten in place.

Only the text between BEGIN and END in docs/benchmarks.md is the benchmark's: what each
figure means, how it is taken and what the goals are stand by hand around it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scripts import doc_block
from scripts.bench.results import HOSTS, VARIANTS, Results, Run

BEGIN, END = "<!-- generated: make bench -->", "<!-- end generated -->"
LABELS = {
    "torchrun": "bare torchrun",
    "incumbent": "incumbent (DLC `train`)",
    "ours": "ours",
    "ours-nopreflight": "ours, preflight off",
}
IMAGE_BYTES_GOAL = 5_000_000
Goal = Callable[[list[float], list[float]], bool]  # (ours, bare torchrun) -> met


def median_within(factor: float) -> Goal:
    return lambda o, t: bool(t) and statistics.median(o) <= factor * statistics.median(t)


def median_at_least(factor: float) -> Goal:
    return lambda o, t: bool(t) and statistics.median(o) >= factor * statistics.median(t)


def every_run_under(limit: float) -> Goal:
    return lambda o, t: max(o) <= limit


@dataclass(frozen=True)
class Row:
    label: str
    figure: str  # the Run field
    scale: float  # shown = figure x scale
    digits: int
    goal: str
    met: Goal | None  # None: no goal
    scenario: str  # the runs that should have taken the figure
    missing: str  # what a run without it is called
    ours_only: bool = False  # taken from our own records: "-" for the other launchers


def rows(results: Results) -> list[Row]:
    config = results.config
    stop = f"not every rank signalled (SIGKILL after {config.stop_timeout} s)"
    return [
        Row("container start → first line of the user's script (s)", "start_s", 1, 2,
            "≤ 1.15x bare torchrun (median)", median_within(1.15), "job", "no first line"),
        Row("... of it: the preflight, as its `preflight ok` line says (slowest host, s)",
            "preflight_s", 1, 2, "-", None, "job", "no preflight", ours_only=True),
        Row("... to the first training step done, from container start (s): imports included",
            "first_step_s", 1, 2, "-", None, "job", "no step"),
        Row("print → visible on the container's stdout, median line (ms)", "log_median_s", 1000,
            0, "≤ 1 s (every run)", every_run_under(1.0), "job", "no tick lines"),
        Row("print → visible on the container's stdout, slowest line (ms)", "log_max_s", 1000, 0,
            "≤ 1 s (every run)", every_run_under(1.0), "job", "no tick lines"),
        Row("one rank fails on host 2 of 2 → every container exited (s)", "failure_s", 1, 1,
            "≤ 15 s (every run)", every_run_under(15), "failure",
            f"still running {config.fail_cap:.0f} s after the failure"),
        Row("the script's last statement on every rank → every container exited (s)", "end_s",
            1, 1, "≤ 15 s (every run), as a failure", every_run_under(15), "end",
            "did not end cleanly"),
        Row("... of it: last statement → the rank's process exited (s)", "end_rank_exit_s", 1,
            2, "-", None, "end", "not taken", ours_only=True),
        Row("... of it: the host's last rank exited → `training finished` (s)",
            "end_verdict_s", 1, 2, "-", None, "end", "not taken", ours_only=True),
        Row("... of it: `training finished` → the container exited (s)", "end_finish_s", 1, 2,
            "-", None, "end", "not taken", ours_only=True),
        Row("`docker stop` → every rank signalled (ms)", "sigterm_s", 1000, 0,
            "≤ 1 s (every run)", every_run_under(1.0), "job", stop),
        Row("`docker stop` → every container exited (s)", "stop_all_exited_s", 1, 1,
            f"none (SIGKILL at {config.stop_timeout} s)", None, "job", "no exit time"),
        Row("tiny DDP HF Trainer, steps per second", "steps_per_second", 1, 2,
            "≥ 0.98x bare torchrun (median)", median_at_least(0.98), "job", "failed"),
    ]  # fmt: skip


def values(runs: list[Run], variant: str, figure: str) -> list[float]:
    taken = (r.figure(figure) for r in runs if r.variant == variant)
    return [x for x in taken if x is not None]


def cell(xs: list[float], scale: float = 1.0, digits: int = 2) -> str:
    if not xs:
        return "n/a"
    med = statistics.median(xs) * scale
    if len(xs) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(xs) * scale:.{digits}f}-{max(xs) * scale:.{digits}f})"


def ratio(a: list[float], b: list[float]) -> str:
    if not a or not b or statistics.median(b) == 0:
        return "n/a"
    return f"{statistics.median(a) / statistics.median(b):.2f}x"


def variants_run(runs: list[Run]) -> list[str]:
    return [v for v in VARIANTS if any(r.variant == v for r in runs)]


def figure_row(row: Row, runs: list[Run], variants: list[str]) -> str:
    xs = {v: values(runs, v, row.figure) for v in VARIANTS}
    shown = []
    for v in variants:
        if row.ours_only and not v.startswith("ours"):
            shown.append("-")
            continue
        text = cell(xs[v], row.scale, row.digits)
        expected = sum(1 for r in runs if r.variant == v and r.scenario == row.scenario)
        if missing := expected - len(xs[v]):
            text = (text + "; " if xs[v] else "") + (
                f"{row.missing} in {missing} run{'s' if missing > 1 else ''}"
            )
        shown.append(text)
    if row.met is None:
        verdict = "-"
    else:
        verdict = "yes" if xs["ours"] and row.met(xs["ours"], xs["torchrun"]) else "**no**"
    return (
        f"| {row.label} | {' | '.join(shown)} | {ratio(xs['ours'], xs['torchrun'])} | "
        f"{ratio(xs['ours'], xs['incumbent'])} | {row.goal} | {verdict} |"
    )


def figures_table(results: Results) -> list[str]:
    """A column per variant, ours against the others, the goal and whether ours meets it."""
    variants = variants_run(results.runs)
    added = [f"{results.sizes.added(v):,}" for v in variants]
    met = "yes" if results.sizes.added("ours") <= IMAGE_BYTES_GOAL else "**no**"
    return [
        f"| measure | {' | '.join(LABELS[v] for v in variants)} | ours / torchrun | "
        "ours / incumbent | goal | met |",
        "|---" * (len(variants) + 5) + "|",
        *(figure_row(row, results.runs, variants) for row in rows(results)),
        f"| image bytes added over the base | {' | '.join(added)} | - | - | ≤ 5 MB | {met} |",
    ]


def conditions_table(results: Results) -> list[str]:
    """The machine, its load and the job's parameters (named in the text around the block)."""
    config, info, load = results.config, results.machine, results.load
    during = max([r.load1 for r in results.runs] + [load.after])
    other_load = (
        "present: read the ratios, measured side by side, rather than the absolute figures"
        if load.others or load.before > 1.0
        else "none seen"
    )
    settings = [
        ("machine", f"{info.cpus} CPUs ({info.cpu}), {info.memory} memory, kernel {info.kernel}, "
                    f"docker {info.docker}; no GPU: CPU DDP on gloo"),
        ("1-minute load average", f"{load.before:.2f} before, up to {during:.2f} during, "
                                  f"{load.after:.2f} after the runs"),
        ("other containers running when a measured job started", f"{load.others} at most"),
        ("other load", other_load),
        ("job", f"{len(HOSTS)} hosts x {config.procs} process(es) = world size {config.world}"),
        ("images", f"`{config.base}` (bare torchrun, incumbent), `{config.image}` (ours)"),
        ("rounds", str(results.rounds)),
        ("tick interval", f"{config.tick_seconds:g} s"),
        ("ticks after training, before `docker stop`", str(config.ticks)),
        ("planted failure at tick", str(config.fail_tick)),
        ("a failed job still running after this counts as never", f"{config.fail_cap:.0f} s"),
        ("`docker stop -t`", f"{config.stop_timeout} s"),
        ("HF Trainer steps; steps/s counted from step", f"{config.steps}; {config.warmup}"),
    ]  # fmt: skip
    return ["| setting | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in settings)]


def render(results: Results) -> str:
    """The generated block: when, under what conditions, the figures, the failed runs."""
    lines = [
        f"Generated by `{results.command}` on {results.machine.date}.",
        "",
        *conditions_table(results),
        "",
        *figures_table(results),
    ]
    errors = [r for r in results.runs if r.error]
    if errors:
        lines += ["", "Runs that failed (full logs in build/benchmark.json):", ""]
        lines += [
            f"- round {r.round}: {r.variant} {r.scenario}: {r.error.splitlines()[0]}"
            for r in errors
        ]
    return "\n".join(lines)


def replace_block(page: str, block: str) -> str:
    """`page` with its `make bench` block replaced by `block`."""
    return doc_block.replace_block(page, block, BEGIN, END)


def write_block(path: Path, block: str) -> None:
    """Rewrite the generated block of `path`, leaving every other line as it is."""
    doc_block.write_block(path, block, BEGIN, END)
