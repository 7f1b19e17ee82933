"""Checks of the values in side-channel messages, which come from the network: known fields
only, each of its type, strings and numbers bounded. Each check raises `Invalid` naming the
field, so a refusal says what was wrong. Also the relayed failure record's schema, and
`fitted_record`, which cuts this host's own failure to it before posting."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal, overload

from container_entry.common.exits import signal_name
from container_entry.common.records import RankRecord
from container_entry.common.stopping import STOP_SIGNALS
from container_entry.hosts.wire import LINE_LIMIT, Invalid, MessageKind, encode

TEXT_CAP = 2000  # characters of a failure's free text (what, exception message, ...)
NAME_CAP = 253  # characters of a host name (DNS), a boot id, an exception's type
SHORT_CAP = 64  # characters of a signal's name, a stage

# a failure as another host needs it (RankRecord.relayed()): JSON-ready, checked field by field
Relayed = dict[str, Any]

_RECORD_TEXT = ("what", "last_words", "fatal_error", "summary")
_RECORD_NAMES = ("signal", "stage")
# a stop's signal: the receiving host sends it to its own ranks (PEER_STOPPED)
_STOP_NAMES = frozenset(signal_name(int(sig)) for sig in STOP_SIGNALS)
_RECORD_FIELDS = frozenset(RankRecord(host=None, rank=None).relayed())
_HEX = re.compile(r"[0-9a-f]{64}")


def fields(
    message: Mapping[str, Any], required: Iterable[str], optional: Iterable[str] = ()
) -> None:
    """Only known fields, and every required one."""
    kind = message.get("type")
    allowed = {"type", *required, *optional}
    unknown = sorted(repr(str(k)[:40]) for k in message if k not in allowed)
    if unknown:
        raise Invalid(f"{kind} with unknown field(s) {', '.join(unknown[:4])}")
    missing = [name for name in required if name not in message]
    if missing:
        raise Invalid(f"{kind} without {', '.join(missing)}")


@overload
def text(value: Any, what: str, cap: int, *, none: Literal[False]) -> str: ...
@overload
def text(value: Any, what: str, cap: int, *, none: bool = True) -> str | None: ...
def text(value: Any, what: str, cap: int, *, none: bool = True) -> str | None:
    """A string of at most `cap` characters (or None where `none`)."""
    if value is None and none:
        return None
    if not isinstance(value, str):
        raise Invalid(f"{what} is not a string")
    if len(value) > cap:
        raise Invalid(f"{what} is longer than {cap} characters")
    return value


@overload
def integer(value: Any, what: str, low: int, high: int, *, none: Literal[False] = ...) -> int: ...
@overload
def integer(value: Any, what: str, low: int, high: int, *, none: bool) -> int | None: ...
def integer(value: Any, what: str, low: int, high: int, *, none: bool = False) -> int | None:
    """An integer (not a bool) from `low` to `high` (or None where `none`)."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"{what} is not an integer")
    if not low <= value <= high:
        raise Invalid(f"{what} is not between {low} and {high}")
    return value


def number(value: Any, what: str, low: float, high: float) -> float | None:
    """A finite number from `low` to `high`, as a float, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid(f"{what} is not a number")
    if not (math.isfinite(value) and low <= value <= high):
        raise Invalid(f"{what} is not a finite number between {low:g} and {high:g}")
    return float(value)


def hex64(value: Any, what: str) -> str:
    """A nonce or a proof: 64 lowercase hex digits."""
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        raise Invalid(f"{what} is not 64 hex digits")
    return value


def failure_record(value: Any) -> Relayed:
    """A relayed failure (RankRecord.relayed()) checked field by field."""
    if not isinstance(value, dict):
        raise Invalid("failure is not an object")
    unknown = sorted(repr(str(k)[:40]) for k in value if k not in _RECORD_FIELDS)
    if unknown:
        raise Invalid(f"failure with unknown field(s) {', '.join(unknown[:4])}")
    record: Relayed = {}
    for name, item in value.items():
        if name == "host":
            record[name] = text(item, "failure host", NAME_CAP)
        elif name in ("rank", "local_rank"):
            record[name] = integer(item, f"failure {name}", 0, 2**31, none=True)
        elif name == "returncode":
            record[name] = integer(item, "failure returncode", -255, 255)
        elif name == "restart_count":
            record[name] = integer(item, "failure restart_count", 0, 10**9)
        elif name in _RECORD_NAMES:
            record[name] = text(item, f"failure {name}", SHORT_CAP)
        elif name == "stop":
            record[name] = _stop(item)
        elif name in _RECORD_TEXT:
            record[name] = text(item, f"failure {name}", TEXT_CAP)
        elif name in ("ended_at", "failed_at", "script_ended_at"):
            record[name] = number(item, f"failure {name}", 0, 1e11)
        elif name == "exception":
            record[name] = _exception(item)
        else:  # a field added to RankRecord later: a plain, bounded value
            record[name] = _plain(item, f"failure {name}")
    return record


def _stop(value: Any) -> dict[str, Any] | None:
    """A relayed stop (StopSignal.to_json): a stop signal's name and a moment."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"name", "at"}:
        raise Invalid("failure stop is not a stop signal and a moment")
    name = text(value["name"], "failure stop name", SHORT_CAP)
    if name not in _STOP_NAMES:
        raise Invalid(f"failure stop {name!r} is not a stop signal")
    return {"name": name, "at": number(value["at"], "failure stop at", 0, 1e11)}


def _plain(value: Any, what: str) -> str | int | float | None:
    if value is None or isinstance(value, str):
        return text(value, what, TEXT_CAP)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return integer(value, what, -(2**53), 2**53)
    if isinstance(value, float):
        return number(value, what, -1e300, 1e300)
    raise Invalid(f"{what} is not a string or a number")


def _exception(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"type", "message"}:
        raise Invalid("failure exception is not {type, message}")
    exception: dict[str, str] = {}
    for name, cap in (("type", NAME_CAP), ("message", TEXT_CAP)):
        if name in value:
            exception[name] = text(value[name], f"failure exception {name}", cap, none=False)
    return exception


def fitted_record(record: Relayed) -> Relayed:
    """A failure of this host cut to what the schema allows (free text shortened), so that
    what a member posts always passes the master's checks."""
    record = dict(record)
    for name in _RECORD_TEXT:
        if isinstance(record.get(name), str):
            record[name] = record[name][:TEXT_CAP]
    for name in _RECORD_NAMES:
        if isinstance(record.get(name), str):
            record[name] = record[name][:SHORT_CAP]
    exception = record.get("exception")
    if isinstance(exception, dict):
        record["exception"] = {
            k: str(v)[: NAME_CAP if k == "type" else TEXT_CAP]
            for k, v in exception.items()
            if k in ("type", "message")
        }
    # escaped, non-ASCII text may still make the line too long: halve the longest text
    while len(encode({"type": MessageKind.FAILED, "failure": record})) > LINE_LIMIT:
        texts = [(len(record[n]), n) for n in _RECORD_TEXT if isinstance(record.get(n), str)]
        message = (record.get("exception") or {}).get("message")
        if isinstance(message, str):
            texts.append((len(message), "exception"))
        if not texts:
            break
        length, name = max(texts)
        if name == "exception" and isinstance(message, str):
            record["exception"] = {**record["exception"], "message": message[: length // 2]}
        else:
            record[name] = record[name][: length // 2]
    return record
