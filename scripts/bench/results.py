"""What one `make bench` measures, as typed records; saved to and read from JSON."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

VARIANTS = ("torchrun", "incumbent", "ours", "ours-nopreflight")
HOSTS = ("algo-1", "algo-2")


@dataclass(frozen=True)
class Config:
    """The launch and the job's parameters, the same for every variant."""

    image: str  # ours
    base: str  # the DLC stand-in: bare torchrun and the incumbent run in it
    procs: int  # processes per host
    ticks: int  # ticks every rank must have printed after training before `docker stop`
    tick_seconds: float
    fail_tick: int  # the tick at which the planted failure raises
    steps: int  # HF Trainer steps
    warmup: int  # steps/s counted from this step
    stop_timeout: int  # `docker stop -t`
    fail_cap: float  # a failed job still running this long after the failure counts as hung

    @property
    def world(self) -> int:
        return self.procs * len(HOSTS)


@dataclass
class Run:
    """One scenario run by one variant; a figure is None where it could not be taken."""

    variant: str
    scenario: str
    round: int = 0
    others_at_start: int = 0  # other containers running when it started
    load1: float = 0.0  # 1-minute load average when it ended
    error: str = ""  # first line: why; then the containers' last log lines
    world: list[int] = field(default_factory=list)  # world sizes the ranks reported
    # scenario "job": start, log latency, throughput, then `docker stop`
    start_s: float | None = None
    preflight_s: float | None = None  # of it: the slowest host's preflight, as its ok line says
    first_step_s: float | None = None  # container start -> the first training step done
    log_median_s: float | None = None
    log_max_s: float | None = None
    log_lines: int = 0
    ranks_ticking: int = 0
    ranks_signalled: int = 0
    sigterm_s: float | None = None
    stop_exit: list[int] = field(default_factory=list)
    stop_exited_by_host_s: dict[str, float] = field(default_factory=dict)
    stop_all_exited_s: float | None = None
    steps_per_second: float | None = None  # bench-train.json, written by rank 0
    steps: int | None = None
    world_size: int | None = None
    parallel_mode: str | None = None
    # scenario "failure": one rank raises
    exit_codes: list[int] = field(default_factory=list)
    hung: bool = False
    failure_exited_by_host_s: dict[str, float] = field(default_factory=dict)
    failure_s: float | None = None
    # scenario "end": the script ends by itself after its ticks
    end_exit: list[int] = field(default_factory=list)
    end_s: float | None = None  # every rank's last statement -> every container exited
    # ... where that goes (ours only, from the rank records and docker's line timestamps):
    end_rank_exit_s: float | None = None  # last statement -> the rank's process exited
    end_verdict_s: float | None = None  # the host's last rank exited -> "training finished"
    end_finish_s: float | None = None  # "training finished" -> the container exited

    def figure(self, name: str) -> float | None:
        value = getattr(self, name)
        return None if value is None else float(value)

    def brief(self) -> dict[str, Any]:
        """The fields that say something, without the error text (a progress line)."""
        empty: tuple[object, ...] = (None, "", [], {}, False)
        return {
            k: v for k, v in dataclasses.asdict(self).items() if k != "error" and v not in empty
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known and v is not None}
        return cls(**values)


@dataclass(frozen=True)
class Machine:
    cpus: str
    cpu: str
    memory: str
    kernel: str
    docker: str
    date: str  # when the benchmark ran, UTC


@dataclass
class Load:
    """1-minute load averages and the most other containers seen at a job's start."""

    before: float
    after: float = 0.0
    others: int = 0


@dataclass(frozen=True)
class ImageSizes:
    """`docker image inspect` sizes in bytes."""

    base: int
    ours: int

    def added(self, variant: str) -> int:
        """Bytes the variant's image adds over the base (bare torchrun and incumbent: none)."""
        return (self.ours if variant.startswith("ours") else self.base) - self.base


@dataclass
class Results:
    command: str
    config: Config
    sizes: ImageSizes
    machine: Machine
    load: Load
    runs: list[Run]

    @property
    def rounds(self) -> int:
        return max((r.round for r in self.runs), default=0) + 1

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Results:
        data = json.loads(text)
        sizes = data["sizes"]
        return cls(
            command=data["command"],
            config=Config(**data["config"]),
            sizes=ImageSizes(base=sizes["base"], ours=sizes["ours"]),
            machine=Machine(**data["machine"]),
            load=Load(**data["load"]),
            runs=[Run.from_json(r) for r in data["runs"]],
        )
