"""The GPU check's fr-fields scenario: the flight recorder's records carry what the straggler
analysis reads (container_entry/diagnose/stragglers.py, docs/stragglers.md).

One rank (scripts/gpu/fr_probe.py) runs a short all_reduce loop in a group made without
TORCH_NCCL_ENABLE_TIMING and in one made with it, and prints its recorder's dump. The records
must carry the group (`process_group`), its sequence number (`collective_seq_id`) and the CPU's
entry time (`time_created_ns`, epoch nanoseconds) on every backend; on NCCL, `duration_ms` on
every collective of the timed group and on none of the other (the variable is what fills it).
The dump is then read as the bootstrap reads it (`summarize`): every collective of both groups
in the summary, with its duration where the group was timed. On cpu (gloo, the self-test) the
generic recorder is checked the same way, durations aside: gloo fills none.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Mapping
from typing import Any

from container_entry.diagnose.stragglers import summarize
from scripts.gpu.jobs import REPO, Context, Failed, expect, free_port_pair, short

PROGRAM = REPO / "scripts" / "gpu" / "fr_probe.py"
TIMEOUT = 300.0  # torch's import and NCCL's start on a cold host included
COLLECTIVES = 20  # per group, as fr_probe.py runs them
EPOCH_2020_NS = 1_577_836_800 * 10**9  # a time_created_ns before this is not epoch time


def check_fr_fields(ctx: Context) -> str:
    folder = ctx.work / "fr-fields"
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        **ctx.env,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port_pair()),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "TORCH_FR_BUFFER_SIZE": "200",  # off by default before torch 2.10
    }
    env.pop("TORCH_NCCL_ENABLE_TIMING", None)  # the probe sets it for its second group only
    try:
        done = subprocess.run(
            [ctx.python, str(PROGRAM), "--device", ctx.device],
            env=env,
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise Failed(f"fr_probe.py ran past {TIMEOUT:g} s") from None
    (folder / "out.txt").write_text(done.stdout + done.stderr)
    tail = (done.stderr.strip().splitlines() or [""])[-1]
    expect(done.returncode == 0, f"fr_probe.py exit {done.returncode}: {short(tail)}")
    line = next((x for x in done.stdout.splitlines() if x.startswith("FR ")), None)
    expect(line, "fr_probe.py printed no FR line")
    try:
        records = json.loads(str(line)[3:])
    except ValueError as error:
        raise Failed(f"the FR line is not JSON: {error}") from None
    return judge(records, ctx.device)


def judge(records: Mapping[str, Any], device: str) -> str:
    """The verdict's detail for a dump of fr_probe.py; Failed names the first field missing."""
    backend = "nccl" if device == "cuda" else "generic"
    recorder = (records.get("recorders") or {}).get(backend)
    if not isinstance(recorder, Mapping):
        raise Failed(f"no {backend} recorder in the dump")
    by_group: dict[str, list[Mapping[str, Any]]] = {}
    for entry in recorder.get("entries") or []:
        group = entry.get("process_group") if isinstance(entry, Mapping) else None
        if not isinstance(group, list) or not group:
            raise Failed(f"a record without process_group: {short(str(entry))}")
        by_group.setdefault(str(group[0]), []).append(entry)
    timed = next((g for g, es in by_group.items() if es[0]["process_group"][1:] == ["timed"]), "")
    expect("0" in by_group and timed, f"groups recorded: {sorted(by_group)}, not 0 and timed")
    for name in ("0", timed):
        fields(by_group[name], name)
    summary = {g.name: g for g in summarize(0, 0, "algo-1", records, None).groups}
    for name in ("0", timed):
        seqs = summary[name].seqs if name in summary else ()
        kept = f"summarize kept {len(seqs)} of group {name}'s {len(by_group[name])} records"
        expect(len(seqs) == len(by_group[name]), kept)
    count = len(by_group["0"]) + len(by_group[timed])
    said = f"{backend}: process_group, collective_seq_id, time_created_ns on {count}"
    if backend != "nccl":
        found = sum("duration_ms" in e for es in by_group.values() for e in es)
        return f"{said}; duration_ms on {found} (gloo fills none; time_created_ns is read)"
    untimed = [e for e in by_group["0"] if "duration_ms" in e]
    expect(not untimed, f"duration_ms without TORCH_NCCL_ENABLE_TIMING on {len(untimed)}")
    durations = [d for d in summary[timed].durations if d is not None]
    wanted = len(by_group[timed])
    expect(
        len(durations) == wanted,
        f"duration_ms on {len(durations)} of {wanted} with TORCH_NCCL_ENABLE_TIMING=1",
    )
    median = statistics.median(durations) * 1e3
    return (
        f"{said}; duration_ms on {wanted}/{wanted} with TORCH_NCCL_ENABLE_TIMING=1 "
        f"(median {median:.3f} ms), 0/{len(by_group['0'])} without"
    )


def fields(entries: list[Mapping[str, Any]], group: str) -> None:
    """The group's records: numbered from 1 without a gap (at least the probe's COLLECTIVES;
    a torch whose group setup runs a collective of its own has one more), each with its epoch
    entry time."""
    seqs = [e.get("collective_seq_id") for e in entries]
    numbered = seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= COLLECTIVES
    expect(numbered, f"group {group}'s sequence numbers: {seqs}")
    for entry in entries:
        created = entry.get("time_created_ns")
        expect(
            isinstance(created, int) and created > EPOCH_2020_NS,
            f"group {group} #{entry.get('collective_seq_id')}: time_created_ns {created!r}",
        )
