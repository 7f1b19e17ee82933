"""Every side-channel message, typed as it is on the wire (a JSON object whose "type" is its
`MessageKind`), and its schema: `to_master` and `to_member` check what arrives from the network and
return the typed message, or raise `Invalid` saying what is wrong."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from container_entry.diagnose.arrivals import RankArrivals
from container_entry.diagnose.culprit import RankCalls
from container_entry.hosts.gathering import from_wire
from container_entry.hosts.schema import (
    NAME_CAP,
    TEXT_CAP,
    Relayed,
    failure_record,
    fields,
    hex64,
    integer,
    number,
    text,
)
from container_entry.hosts.wire import Invalid, MessageKind

WAITING_NAMES = 16  # host names a master's heartbeat lists while the join is incomplete
REASON_CAP = 200  # characters of a refusal's reason
MAX_ARRIVAL_RANKS = 512  # ranks in one host's `arrivals`


class Hello(TypedDict):
    type: Literal[MessageKind.HELLO]
    version: int
    nonce: str  # the master's challenge to this connection


class Join(TypedDict):
    type: Literal[MessageKind.JOIN]
    host: str
    machine: str | None  # its kernel's boot id: hosts on one machine share its cores
    workers: int
    nonce: str  # the member's challenge to the master
    proof: str  # keys.join_proof


class Welcome(TypedDict):
    type: Literal[MessageKind.WELCOME]
    proof: str  # keys.welcome_proof


class Refused(TypedDict):
    type: Literal[MessageKind.REFUSED]
    reason: str


class Start(TypedDict):
    type: Literal[MessageKind.START]
    machines: dict[str, list[int]]  # boot id -> [hosts, workers] of this job on it


class MemberBeat(TypedDict):
    type: Literal[MessageKind.BEAT]
    idle: float | None  # seconds this host's ranks were silent; None: no job running
    time: float | None  # the member's clock, for the master's estimate of its skew


class MasterBeat(TypedDict):
    type: Literal[MessageKind.BEAT]
    waiting: NotRequired[list[str] | None]  # during the join: hosts still missing (some)
    waiting_count: NotRequired[int]  # and how many in all


class Failed(TypedDict):
    type: Literal[MessageKind.FAILED]
    failure: Relayed


class Abort(TypedDict):
    type: Literal[MessageKind.ABORT]
    failure: Relayed


class First(TypedDict):
    type: Literal[MessageKind.FIRST]
    failure: Relayed
    final: bool  # every host settled (or the wait is over): the decision no longer changes


class Settled(TypedDict):
    type: Literal[MessageKind.SETTLED]


class Done(TypedDict):
    type: Literal[MessageKind.DONE]
    host: str | None


class Records(TypedDict):
    type: Literal[MessageKind.RECORDS]
    ranks: list[RankCalls]  # checked by gathering.from_wire; its host is the sender's


class ArrivalsMessage(TypedDict):
    type: Literal[MessageKind.ARRIVALS]
    ranks: list[RankArrivals]  # checked by RankArrivals.from_json; its host is the sender's


class Culprit(TypedDict):
    type: Literal[MessageKind.CULPRIT]
    what: str | None  # the culprit in words; None: the records name no one


ToMaster = Join | MemberBeat | Failed | Settled | Done | Records | ArrivalsMessage
ToMember = Hello | Welcome | Refused | Start | Abort | First | MasterBeat | Culprit


def to_master(message: dict[str, Any]) -> ToMaster:
    """A message from a member, checked against its schema (Invalid says what is wrong)."""
    kind = message.get("type")
    if kind == MessageKind.JOIN:
        fields(message, ("host", "machine", "workers", "nonce", "proof"))
        return Join(
            type=MessageKind.JOIN,
            host=text(message["host"], "join host", NAME_CAP, none=False),
            machine=text(message["machine"], "join machine", NAME_CAP),
            workers=integer(message["workers"], "join workers", 0, 1 << 20),
            nonce=hex64(message["nonce"], "join nonce"),
            proof=hex64(message["proof"], "join proof"),
        )
    if kind == MessageKind.BEAT:
        fields(message, (), ("idle", "time"))
        idle = number(message.get("idle"), "beat idle", 0, 1e12)
        sent = number(message.get("time"), "beat time", 0, 1e12)
        return MemberBeat(type=MessageKind.BEAT, idle=idle, time=sent)
    if kind == MessageKind.FAILED:
        fields(message, ("failure",))
        return Failed(type=MessageKind.FAILED, failure=failure_record(message["failure"]))
    if kind == MessageKind.SETTLED:
        fields(message, ())
        return Settled(type=MessageKind.SETTLED)
    if kind == MessageKind.DONE:
        fields(message, (), ("host",))
        return Done(type=MessageKind.DONE, host=text(message.get("host"), "done host", NAME_CAP))
    if kind == MessageKind.RECORDS:
        fields(message, ("ranks",))
        return Records(type=MessageKind.RECORDS, ranks=from_wire(message["ranks"], "?"))
    if kind == MessageKind.ARRIVALS:
        fields(message, ("ranks",))
        return ArrivalsMessage(type=MessageKind.ARRIVALS, ranks=_arrivals(message["ranks"]))
    raise Invalid(f"unknown message type {str(kind)[:40]!r}")


def to_member(message: dict[str, Any]) -> ToMember:
    """A message from the master, checked against its schema."""
    kind = message.get("type")
    if kind == MessageKind.HELLO:
        fields(message, ("version", "nonce"))
        version = integer(message["version"], "hello version", 0, 1 << 30)
        return Hello(
            type=MessageKind.HELLO, version=version, nonce=hex64(message["nonce"], "hello nonce")
        )
    if kind == MessageKind.WELCOME:
        fields(message, ("proof",))
        return Welcome(type=MessageKind.WELCOME, proof=hex64(message["proof"], "welcome proof"))
    if kind == MessageKind.REFUSED:
        fields(message, ("reason",))
        reason = text(message["reason"], "refusal reason", REASON_CAP, none=False)
        return Refused(type=MessageKind.REFUSED, reason=reason)
    if kind == MessageKind.START:
        fields(message, ("machines",))
        return Start(type=MessageKind.START, machines=_machines(message["machines"]))
    if kind == MessageKind.ABORT:
        fields(message, ("failure",))
        return Abort(type=MessageKind.ABORT, failure=failure_record(message["failure"]))
    if kind == MessageKind.FIRST:
        fields(message, ("failure", "final"))
        final = message["final"]
        if not isinstance(final, bool):
            raise Invalid("first final is not true or false")
        return First(
            type=MessageKind.FIRST, failure=failure_record(message["failure"]), final=final
        )
    if kind == MessageKind.BEAT:
        fields(message, (), ("waiting", "waiting_count"))
        return _master_beat(message)
    if kind == MessageKind.CULPRIT:
        fields(message, ("what",))
        return Culprit(type=MessageKind.CULPRIT, what=text(message["what"], "culprit", TEXT_CAP))
    raise Invalid(f"unknown message type {str(kind)[:40]!r}")


def _arrivals(value: Any) -> list[RankArrivals]:
    if not isinstance(value, list) or len(value) > MAX_ARRIVAL_RANKS:
        raise Invalid(f"arrivals is not a list of at most {MAX_ARRIVAL_RANKS} ranks")
    try:
        return [RankArrivals.from_json(item) for item in value]
    except ValueError as error:
        raise Invalid(str(error)[:200]) from None


def _machines(value: Any) -> dict[str, list[int]]:
    if not isinstance(value, dict):
        raise Invalid("start machines is not an object")
    machines: dict[str, list[int]] = {}
    for machine, tally in value.items():
        text(machine, "start machine", NAME_CAP, none=False)
        if not isinstance(tally, list) or len(tally) != 2:
            raise Invalid("start machine tally is not [hosts, workers]")
        machines[machine] = [integer(count, "start machine tally", 0, 1 << 30) for count in tally]
    return machines


def _master_beat(message: dict[str, Any]) -> MasterBeat:
    beat = MasterBeat(type=MessageKind.BEAT)
    if "waiting" in message:
        waiting = message["waiting"]
        if waiting is not None:
            if not isinstance(waiting, list) or len(waiting) > WAITING_NAMES:
                raise Invalid(f"beat waiting is not a list of at most {WAITING_NAMES} names")
            for name in waiting:
                text(name, "beat waiting name", NAME_CAP, none=False)
        beat["waiting"] = waiting
    count = integer(message.get("waiting_count", 0), "beat waiting_count", 0, 1 << 30)
    if "waiting_count" in message:
        beat["waiting_count"] = count
    return beat
