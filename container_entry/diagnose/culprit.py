"""Which rank a hang is waiting for, from every rank's flight-recorder records: pure.

Each rank's dump (flight_recorder.py) lists the collectives it entered, per process group, with
the group's sequence number, the operation, its tensors and whether it completed. Lined up by
group and sequence number across ranks they answer the question a stack listing leaves to the
reader: in a group whose ranks wait in collective #N, a rank whose records stop before #N never
entered it (the culprit); ranks whose records hold different operations (or tensors) at the
same number have desynchronised. Stdlib only, no torch: the bootstrap runs it on records
gathered from every host; torch's own analyser (`torchfrtrace`, torch.distributed.flight_recorder)
reads dump files on disk with torch imported, which the bootstrap never does.
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from container_entry.common.layout import RunDir
from container_entry.diagnose.failure import where

# torch's dtype names in the records -> the names users write
_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
}
ENTRIES_KEPT = 64  # per rank and group: what a hang needs is the tail of each sequence


@dataclass(frozen=True)
class Call:
    """One collective as a rank recorded it, reduced to what the comparison needs."""

    group: str  # the process group's name ("0" is the default group)
    seq: int  # its collective sequence number in that group
    op: str  # "all_reduce"
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    done: bool = False
    created: float | None = None  # epoch seconds: when the rank's CPU entered it (every backend)
    # seconds from the rank's GPU reaching it to its end (NCCL's duration_ms: only with
    # TORCH_NCCL_ENABLE_TIMING, once the watchdog retired it): docs/stragglers.md
    duration: float | None = None
    group_desc: str = ""  # the group's description ("default_pg", "tensor_parallel")

    @property
    def signature(self) -> str:
        """'all_reduce([4096] float32)'."""
        tensors = ", ".join(
            f"[{'x'.join(map(str, shape))}] {dtype}"
            for shape, dtype in zip(self.shapes, self.dtypes, strict=False)
        )
        return f"{self.op}({tensors})"


@dataclass
class RankCalls:
    """One rank's facts for the analysis."""

    rank: int
    host: str
    calls: list[Call] = field(default_factory=list)
    groups: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # name->desc
    where: str | None = None  # where its main thread was ('train.py:88 in evaluate')


def calls_of(dump: Mapping[str, Any], limit: int = ENTRIES_KEPT) -> list[Call]:
    """The collectives of one rank's dump (every recorder), the last `limit` of each group.
    A group destroyed and made again under the same name (the preflight's before the
    script's, in one process; a script that starts its group twice) counts its collectives
    from 1 again: only its newest life counts."""
    found: dict[tuple[str, int], Call] = {}
    for recorder in _recorders(dump):
        for (group, seq), call in _newest_lives(recorder.get("entries") or []).items():
            found[(group, seq)] = call
    by_group: dict[str, list[Call]] = {}
    for call in sorted(found.values(), key=lambda c: (c.group, c.seq)):
        by_group.setdefault(call.group, []).append(call)
    return [call for calls in by_group.values() for call in calls[-limit:]]


def _newest_lives(entries: Any) -> dict[tuple[str, int], Call]:
    """One recorder's calls, oldest first, with each group's older lives dropped."""
    if not isinstance(entries, list):
        return {}
    ordered = sorted((e for e in entries if isinstance(e, Mapping)), key=_record_id)
    lives: dict[str, dict[int, Call]] = {}
    for entry in ordered:
        call = _call(entry)
        if call is None:
            continue
        life = lives.setdefault(call.group, {})
        if life and call.seq <= max(life):  # counted from 1 again: the group was made anew
            life.clear()
        life[call.seq] = call
    return {(group, seq): call for group, life in lives.items() for seq, call in life.items()}


def _record_id(entry: Mapping[str, Any]) -> int:
    number = entry.get("record_id")
    return number if isinstance(number, int) else 0


def groups_of(dump: Mapping[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Process group name -> (description, global ranks), from the recorders' pg_config."""
    groups: dict[str, tuple[str, tuple[int, ...]]] = {}
    for recorder in _recorders(dump):
        config = recorder.get("pg_config")
        if not isinstance(config, Mapping):
            continue
        for name, item in config.items():
            if isinstance(item, Mapping):
                groups[str(name)] = (str(item.get("desc") or ""), _ranks(item.get("ranks")))
    return groups


def _recorders(dump: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    recorders = dump.get("recorders")
    if not isinstance(recorders, Mapping):
        return []
    return [r for r in recorders.values() if isinstance(r, Mapping)]


def _ranks(value: Any) -> tuple[int, ...]:
    """pg_config's ranks: a list, or its text ('[0, 1, 2]')."""
    if isinstance(value, str):
        value = [part for part in value.strip("[] ").split(",") if part.strip()]
    try:
        return tuple(sorted(int(str(v).strip()) for v in value or ()))
    except (TypeError, ValueError):
        return ()


def _call(entry: Any) -> Call | None:
    if not isinstance(entry, Mapping) or entry.get("is_p2p"):
        return None
    try:
        group = entry.get("process_group") or ["?"]
        seq = int(entry["collective_seq_id"])
        op = str(entry.get("profiling_name") or "?").rsplit(":", 1)[-1]
        shapes = tuple(tuple(int(d) for d in shape) for shape in entry.get("input_sizes") or ())
        dtypes = tuple(_DTYPES.get(str(d), str(d)) for d in entry.get("input_dtypes") or ())
        created = entry.get("time_created_ns")
        duration = entry.get("duration_ms")
    except (KeyError, TypeError, ValueError):
        return None
    return Call(
        group=str(group[0]),
        group_desc=str(group[1]) if len(group) > 1 and group[1] else "",
        seq=seq,
        op=op,
        shapes=shapes,
        dtypes=dtypes,
        done=bool(entry.get("retired")) or entry.get("state") == "completed",
        created=created / 1e9 if isinstance(created, int | float) and created else None,
        duration=_seconds(duration),
    )


def _seconds(milliseconds: Any) -> float | None:
    """NCCL's duration_ms in seconds; None where the record has none (or not a number)."""
    if isinstance(milliseconds, bool) or not isinstance(milliseconds, int | float):
        return None
    return milliseconds / 1e3 if milliseconds >= 0 else None


def ranges(ranks: Iterable[int]) -> str:
    """'rank 3', 'ranks 0-2, 5'."""
    items = sorted(set(ranks))
    parts: list[str] = []
    start = previous = None
    for rank in [*items, None]:
        if rank is not None and previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = rank
    return f"rank{'s' if len(items) > 1 else ''} {', '.join(parts)}"


def _on_hosts(ranks: Sequence[RankCalls]) -> str:
    """'rank 3 on algo-2', 'ranks 3, 5 on algo-2 and rank 9 on algo-3'."""
    by_host: dict[str, list[int]] = {}
    for rank in sorted(ranks, key=lambda r: r.rank):
        by_host.setdefault(rank.host, []).append(rank.rank)
    return " and ".join(f"{ranges(numbers)} on {host}" for host, numbers in by_host.items())


def group_name(name: str, desc: str) -> str:
    """'the default group', 'group tensor_parallel', 'group 2': a process group as a verdict
    names it (torch describes a group made without `group_desc` as "undefined")."""
    if name == "0" or desc == "default_pg":
        return "the default group"
    return f"group {name if desc in ('', 'undefined') else desc}"


def _clock(seconds: float | None) -> str:
    if not seconds:
        return ""
    return " since " + time.strftime("%H:%M:%S UTC", time.gmtime(seconds))


def analyse(ranks: Sequence[RankCalls]) -> str | None:
    """The verdict's words, or None when the records show no pending collective to blame."""
    names = sorted({c.group for r in ranks for c in r.calls}, key=lambda n: (n != "0", n))
    for name in names:
        verdict = _desync(ranks, name) or _missing(ranks, name)
        if verdict:
            return verdict
    return None


def _members(ranks: Sequence[RankCalls], name: str) -> list[RankCalls]:
    """The ranks of group `name`: as its config says, else those that recorded in it."""
    listed = {n for r in ranks for n in r.groups.get(name, ("", ()))[1]}
    return [r for r in ranks if r.rank in listed or any(c.group == name for c in r.calls)]


def _desync(ranks: Sequence[RankCalls], name: str) -> str | None:
    """The first sequence number at which ranks of the group recorded different calls."""
    by_seq: dict[int, dict[str, list[int]]] = {}
    for rank in ranks:
        for call in rank.calls:
            if call.group == name:
                by_seq.setdefault(call.seq, {}).setdefault(call.signature, []).append(rank.rank)
    for seq in sorted(by_seq):
        kinds = by_seq[seq]
        if len(kinds) > 1:
            parts = sorted(kinds.items(), key=lambda item: (-len(item[1]), min(item[1])))
            said = ", ".join(f"{ranges(r)} in {signature}" for signature, r in parts)
            where = "" if name == "0" else f" of {_describe(ranks, name)}"
            return f"ranks disagree at collective #{seq}{where}: {said}"
    return None


def _describe(ranks: Sequence[RankCalls], name: str) -> str:
    desc = next((r.groups[name][0] for r in ranks if name in r.groups), "")
    return group_name(name, desc)


def _missing(ranks: Sequence[RankCalls], name: str) -> str | None:
    """Ranks of the group that never entered the collective the others wait in."""
    members = _members(ranks, name)
    last: dict[int, Call | None] = {}
    for rank in members:
        own = [c for c in rank.calls if c.group == name]
        last[rank.rank] = max(own, key=lambda c: c.seq) if own else None
    pending = [c for c in last.values() if c is not None and not c.done]
    if not pending:
        return None
    target = max(pending, key=lambda c: c.seq)
    waiting = [r for r in members if (c := last[r.rank]) and c.seq == target.seq and not c.done]
    behind = [r for r in members if (c := last[r.rank]) is None or c.seq < target.seq]
    since = _clock(min((c.created for c in pending if c.created), default=None))
    call = f"{target.op} #{target.seq} of {_describe(ranks, name)}"
    if not behind:
        return (
            f"every rank of {_describe(ranks, name)} waits in {target.op} #{target.seq}{since}, "
            "none is missing: the collective itself does not complete (a network or NCCL "
            "problem, or a rank that died inside it)"
        )
    others = len(waiting)
    text = (
        f"{_on_hosts(behind)} never entered {call}; the {others} other "
        f"rank{'s' if others != 1 else ''} wait{'s' if others == 1 else ''} in it{since}"
    )
    located = [f"{ranges([r.rank])} was at {r.where}" for r in behind if r.where]
    return "; ".join([text, *located[:3]])


def _same(value: Any, *_tags: Any) -> Any:
    return value


# torch's pickler may tag a list with its type through these names (torch.jit._pickle); each
# returns the plain value, which is all that is read here
_TYPE_TAGS = {
    ("torch.jit._pickle", name)
    for name in ("build_intlist", "build_doublelist", "build_boollist", "restore_type_tag")
}


class _PlainUnpickler(pickle.Unpickler):
    """NCCL's dump is a pickle of dicts, lists, strings and numbers: nothing else is loaded."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _TYPE_TAGS:
            return _same
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def _nccl_timeout_dump(path: Path) -> dict[str, Any] | None:
    """NCCL's own dump when its watchdog ends a rank on a collective timeout (torch writes it
    to `<nccl_trace_prefix><rank>` before the abort), as one recorder of a dump."""
    try:
        with path.open("rb") as handle:
            data = _PlainUnpickler(handle).load()
    except Exception:  # a torn or foreign file: no records from it
        return None
    return {"recorders": {"nccl-timeout": data}} if isinstance(data, dict) else None


def _dumps_by_rank(run_dir: RunDir) -> dict[int, list[dict[str, Any]]]:
    """Every dump of each rank: asked for (or written at its death), and NCCL's at a timeout."""
    found: dict[int, list[dict[str, Any]]] = {}
    paths = [*run_dir.dumps.glob("rank-*.json"), *run_dir.dumps.glob("exit-rank-*.json")]
    for path in sorted(paths):
        try:
            rank = int(path.stem.rsplit("-", 1)[1])
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, IndexError):
            continue
        if isinstance(data, dict):
            found.setdefault(rank, []).append(data)
    prefix = Path(run_dir.nccl_trace_prefix)
    for path in sorted(prefix.parent.glob(f"{prefix.name}*")):
        number = path.name.removeprefix(prefix.name)
        dump = _nccl_timeout_dump(path) if number.isdigit() else None
        if dump is not None:
            found.setdefault(int(number), []).append(dump)
    return found


def local_ranks(run_dir: RunDir, host: str) -> list[RankCalls]:
    """This host's ranks as their dumps (flight_recorder.py) and stacks recorded them."""
    found = []
    died = {int(p.stem.rsplit("-", 1)[1]) for p in run_dir.dumps.glob("exit-rank-*.json")}
    for rank, dumps in sorted(_dumps_by_rank(run_dir).items()):
        try:
            stacks = run_dir.stack(rank).read_text(errors="replace")
        except OSError:
            stacks = ""
        merged = {"recorders": {f"{i}-{n}": r for i, d in enumerate(dumps) for n, r in _named(d)}}
        calls = calls_of(merged)
        if rank in died:
            calls = _died_in_last(calls)
        found.append(RankCalls(rank, host, calls, groups_of(merged), where(stacks)))
    return found


def _died_in_last(calls: list[Call]) -> list[Call]:
    """A rank that died of an exception (a collective's timeout) died in its last collective of
    each group: gloo marks a call that failed as retired, but the rank was still waiting in it."""
    last: dict[str, int] = {}
    for index, call in enumerate(calls):
        if call.group not in last or call.seq > calls[last[call.group]].seq:
            last[call.group] = index
    pending = set(last.values())
    return [replace(c, done=False) if i in pending else c for i, c in enumerate(calls)]


def _named(dump: Mapping[str, Any]) -> list[tuple[str, Any]]:
    recorders = dump.get("recorders")
    return list(recorders.items()) if isinstance(recorders, Mapping) else []


def explained(what: str, culprit: str | None) -> str:
    """The hang verdict's first line with its culprit, where the records named one:
    'hung: rank 3 on algo-2 never entered all_reduce #1042 ... (no output from any rank ...)'."""
    if not culprit:
        return what
    silence = what.removeprefix("hung: ")
    return f"hung: {culprit} ({silence})"
