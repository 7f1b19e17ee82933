"""How many GPUs the workers will see, decided without initialising CUDA in the bootstrap.

Initialising CUDA in the parent before torchrun forks workers wastes memory on GPU 0 and can
break fork-based workers, so we count from `nvidia-smi -L` and the environment instead, the way
CUDA itself will read them:

- `nvidia-smi -L` lists the GPUs mapped into this container, with their UUIDs and, indented
  under a GPU, its MIG instances.
- `CUDA_VISIBLE_DEVICES` (CUDA's own rules, which torch's NVML-based count mirrors in
  `torch.cuda._parse_visible_devices` and `_device_count_nvml`): entries are read in order;
  integer entries are read like `strtoul` (`1gpu` is `1`), and the list stops at the first
  invalid entry (a negative number, an index past the last GPU, a UUID matching no GPU or more
  than one); a device named twice makes CUDA show no device at all; a list starting with `GPU-`
  or `MIG-` is a list of (prefixes of) UUIDs.
- MIG: a CUDA process enumerates a single MIG instance (NVIDIA's MIG user guide, "CUDA device
  enumeration"), however many exist or are named.
- `NVIDIA_VISIBLE_DEVICES` is what the container runtime mapped in; nvidia-smi already shows
  that, so it only ever lowers the count.

A GPU host whose `nvidia-smi` fails is never taken for a CPU host: that is a problem of the plan
(`GpuCount.problems`), and the plan keeps the GPU defaults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from container_entry.common import offspring

QUERY = "nvidia-smi -L"
QUERY_TIMEOUT = 30.0
_GPU_LINE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?\s*$")
_MIG_LINE = re.compile(r"^\s+MIG .*\(UUID: ([^)]+)\)")
_DEVICE_NODE = re.compile(r"^nvidia(\d+)$")
_NO_DEVICES = {"", "-1", "none", "void", "nodevfiles"}  # deliberate "no GPU" values


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str | None
    mig: tuple[str, ...] = ()  # UUIDs of its MIG instances


@dataclass(frozen=True)
class GpuCount:
    count: int
    source: str  # why we believe it, shown in the plan
    problems: tuple[str, ...] = ()  # why the job must not start
    warnings: tuple[str, ...] = ()  # what the user should know


@dataclass(frozen=True)
class SmiResult:
    """What `nvidia-smi -L` gave: its output when it exited 0, else why not."""

    output: str | None
    error: str | None = None  # None with output None: no nvidia-smi on PATH


def parse_nvidia_smi(output: str) -> list[Gpu]:
    """The GPUs in `nvidia-smi -L` output, each with the MIG instances listed under it."""
    found: list[Gpu] = []
    for line in output.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            found.append(Gpu(int(gpu.group(1)), gpu.group(2).strip(), gpu.group(3)))
            continue
        mig = _MIG_LINE.match(line)
        if mig and found:
            last = found[-1]
            found[-1] = Gpu(last.index, last.name, last.uuid, (*last.mig, mig.group(1)))
    return found


def _strtoul(text: str) -> int:
    """The number `text` starts with, as CUDA's strtoul-like parse reads it; -1 if none."""
    digits = re.match(r"^[+-]?\d+", text)
    return int(digits.group(0)) if digits else -1


@dataclass(frozen=True)
class Visible:
    selected: tuple[str, ...]  # the entries CUDA will use, in its order
    stopped_at: str | None = None  # the entry where CUDA stopped reading, if any
    why_stopped: str = ""
    duplicate: str | None = None  # an entry named twice: CUDA then shows nothing


def _by_uuid(entries: Sequence[str], uuids: Sequence[str], prefix: str) -> Visible:
    chosen: list[str] = []
    for entry in entries:
        if not entry.startswith(prefix):
            return Visible(tuple(chosen), entry, f"not a {prefix} UUID like the first entry")
        matches = [uuid for uuid in uuids if uuid.startswith(entry)]
        if len(matches) != 1:
            why = "matches no device here" if not matches else "matches more than one device"
            return Visible(tuple(chosen), entry, why)
        if matches[0] in chosen:
            return Visible((), duplicate=entry)
        chosen.append(matches[0])
    return Visible(tuple(chosen))


def cuda_visible(value: str, gpus: Sequence[Gpu]) -> Visible:
    """What CUDA makes of CUDA_VISIBLE_DEVICES=value with these devices."""
    entries = value.split(",")
    if value.startswith("GPU-"):
        return _by_uuid(entries, [g.uuid for g in gpus if g.uuid], "GPU-")
    if value.startswith("MIG-"):
        migs = [uuid for g in gpus for uuid in g.mig]
        if not migs:  # nothing to match against: take the names as given
            return Visible(tuple(e for e in entries if e.startswith("MIG-")))
        return _by_uuid(entries, migs, "MIG-")
    chosen: list[str] = []
    for entry in entries:
        index = _strtoul(entry.strip())
        if index < 0:
            return Visible(tuple(chosen), entry, "not a device index")
        if index >= len(gpus):
            return Visible(
                tuple(chosen),
                entry,
                f"no GPU {index} here (this container numbers its {len(gpus)} from 0)",
            )
        if str(index) in chosen:
            return Visible((), duplicate=entry)
        chosen.append(str(index))
    return Visible(tuple(chosen))


def _listed(value: str) -> int | None:
    """Devices named by NVIDIA_VISIBLE_DEVICES; None means 'all' (not a restriction)."""
    value = value.strip()
    if value.lower() in _NO_DEVICES:
        return 0
    if value.lower() == "all":
        return None
    return len([item for item in value.split(",") if item.strip()])


def _failed_query(result: SmiResult, driver: Sequence[str], environ: Mapping[str, str]) -> GpuCount:
    """nvidia-smi gave nothing: a CPU host, unless the driver says GPUs are here.

    /dev/nvidiaN nodes exist only for GPUs mapped into this container; /proc/driver/nvidia/gpus
    shows the whole host's, also in a container started without GPUs."""
    nodes = [p for p in driver if p.startswith("/dev/")]
    listed = [p for p in driver if not p.startswith("/dev/")]
    evidence = ", ".join(sorted(driver)[:3]) + (" ..." if len(driver) > 3 else "")
    unmapped = (environ.get("NVIDIA_VISIBLE_DEVICES") or "").strip().lower() in _NO_DEVICES - {""}
    if not nodes and (result.error is None or unmapped):
        if listed and not unmapped:
            return GpuCount(
                0,
                "no nvidia-smi",
                warnings=(
                    f"the host has NVIDIA GPUs ({evidence}) but none is mapped into this "
                    "container (no /dev/nvidia*, no nvidia-smi): running on CPU; start it with "
                    "--gpus all to use them",
                ),
            )
        return GpuCount(0, "no nvidia-smi" if result.error is None else "no GPU mapped")
    if not driver:
        return GpuCount(0, f"no NVIDIA driver ({QUERY} failed: {result.error})")
    why = result.error or "nvidia-smi is not on PATH"
    return GpuCount(
        len(nodes) or len(listed),
        f"NVIDIA driver files ({QUERY} failed)",
        problems=(
            f"the NVIDIA driver is present ({evidence}) but `{QUERY}` failed: {why}; "
            "not starting, rather than training on CPU by mistake",
        ),
    )


def _by_cuda_visible(cvd: str, gpus: Sequence[Gpu]) -> tuple[GpuCount, list[Gpu]]:
    """What CUDA_VISIBLE_DEVICES=cvd leaves of these GPUs: the count, and the GPUs selected."""
    value = cvd.strip()
    if value.lower() in _NO_DEVICES:
        return GpuCount(0, "CUDA_VISIBLE_DEVICES"), []
    visible = cuda_visible(value, gpus)
    name = f"CUDA_VISIBLE_DEVICES={cvd}"
    problems: list[str] = []
    warnings: list[str] = []
    if visible.duplicate is not None:
        problems.append(f"{name} names {visible.duplicate!r} twice: CUDA then shows no GPU at all")
    elif not visible.selected and gpus:
        problems.append(
            f"{name} selects no GPU: {visible.stopped_at!r} is "
            f"{visible.why_stopped}, and CUDA ignores everything from there on "
            f"({QUERY} lists {len(gpus)})"
        )
    elif visible.stopped_at is not None:
        warnings.append(
            f"{name}: CUDA stops reading at {visible.stopped_at!r} "
            f"({visible.why_stopped}), so only {len(visible.selected)} GPU(s) are used"
        )
    selected = [
        g
        for g in gpus
        if str(g.index) in visible.selected
        or g.uuid in visible.selected
        or set(g.mig) & set(visible.selected)
    ]
    found = GpuCount(
        len(visible.selected), "CUDA_VISIBLE_DEVICES", tuple(problems), tuple(warnings)
    )
    return found, selected


def _with_mig(found: GpuCount, selected: Sequence[Gpu], named: bool) -> GpuCount:
    """MIG GPUs among those selected: a CUDA process sees one MIG instance. `named`: the
    instances were named by CUDA_VISIBLE_DEVICES=MIG-..."""
    mig = [g for g in selected if g.mig]
    instances = found.count if named else sum(len(g.mig) for g in mig)
    problems, warnings = list(found.problems), list(found.warnings)
    if len(mig) < len(selected):
        problems.append(
            f"GPUs with and without MIG are visible ({len(mig)} of {len(selected)} in "
            "MIG mode): a CUDA process sees one MIG instance, or only the whole GPUs; "
            "set CUDA_VISIBLE_DEVICES to the GPUs (or the one MIG instance) to train on"
        )
    elif instances > 1:
        warnings.append(
            f"MIG: {instances} MIG instances are visible but a CUDA process can use only "
            "one, so one worker runs; to train on each instance, run one job (container) "
            "per instance with CUDA_VISIBLE_DEVICES=MIG-<uuid>"
        )
    return GpuCount(
        1, "MIG: a CUDA process sees one MIG instance", tuple(problems), tuple(warnings)
    )


def count_gpus(
    environ: Mapping[str, str],
    nvidia_smi_output: str | None,
    nvidia_smi_error: str | None = None,
    driver: Sequence[str] = (),
) -> GpuCount:
    """Decide how many GPUs the workers will see (see the module's docstring)."""
    if nvidia_smi_output is None:
        return _failed_query(SmiResult(None, nvidia_smi_error), driver, environ)
    gpus = parse_nvidia_smi(nvidia_smi_output)
    found, selected = GpuCount(len(gpus), QUERY), gpus
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        found, selected = _by_cuda_visible(cvd, gpus)
    if found.count and any(g.mig for g in selected):
        found = _with_mig(found, selected, named=(cvd or "").strip().startswith("MIG-"))
    nvidia = environ.get("NVIDIA_VISIBLE_DEVICES")
    listed = _listed(nvidia) if nvidia is not None else None
    if listed is not None and listed < found.count:
        found = dataclasses.replace(found, count=listed, source="NVIDIA_VISIBLE_DEVICES")
    return found


def query_nvidia_smi(timeout: float = QUERY_TIMEOUT) -> SmiResult:
    """Run `nvidia-smi -L`: its output, or why it gave none (its exit and stderr, a timeout)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return SmiResult(None)
    try:
        result = offspring.run(
            [binary, "-L"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return SmiResult(None, f"no answer within {timeout:g} s")
    except OSError as error:
        return SmiResult(None, f"cannot run {binary}: {error.strerror or error}")
    if result.returncode != 0:
        said = " | ".join(
            line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()
        )
        return SmiResult(None, f"exit code {result.returncode}: {said[:300] or 'no output'}")
    return SmiResult(result.stdout)


def read_driver(proc_root: Path = Path("/proc"), dev_root: Path = Path("/dev")) -> tuple[str, ...]:
    """Evidence of the NVIDIA driver: its GPUs in /proc/driver/nvidia/gpus (which a container
    sees for the whole host) and the /dev/nvidiaN nodes (only the GPUs mapped into it)."""
    found = []
    gpus = proc_root / "driver" / "nvidia" / "gpus"
    with contextlib.suppress(OSError):
        found += [str(Path("/proc/driver/nvidia/gpus") / p.name) for p in sorted(gpus.iterdir())]
    try:
        nodes = sorted(n for n in os.listdir(dev_root) if _DEVICE_NODE.match(n))
    except OSError:
        nodes = []
    found += [f"/dev/{name}" for name in nodes]
    return tuple(found)
