"""The master's decision on the job's first failure. The first to arrive stops every other
host at once; one that arrives later but ended earlier, by the ranks' own clocks corrected by
what the heartbeats showed of each host's clock, takes its place. Every host then writes the
same first line, whichever host it is on."""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from typing import Any

from container_entry.side_channel.schema import Relayed

CLOCK_TOLERANCE = 5.0  # seconds: a host whose clock seems further off is ordered by arrival


class Change(enum.Enum):
    """What a failure offered to the decision changed."""

    NONE = "none"  # the decision stands
    FIRST = "first"  # the job's first failure: every other host must stop now
    EARLIER = "earlier"  # it ended before the one decided: it takes its place


class FirstFailure:
    """The decision, changed on the master's loop thread and read from any (`failure`)."""

    def __init__(self) -> None:
        self.failure: Relayed | None = None
        self.skew: float | None = None  # its poster's clock, as `earlier` needs it
        self.lock = threading.Lock()

    def offer(self, failure: Relayed, skew: float | None) -> Change:
        """A failure posted by a host whose clock is `skew` behind the master's (None: not
        measured yet)."""
        with self.lock:
            decided = self.failure
            if decided is None:
                change = Change.FIRST
            elif earlier(failure, skew, decided, self.skew):
                change = Change.EARLIER
            else:
                return Change.NONE
            self.failure, self.skew = failure, skew
        return change


def began(failure: Mapping[str, Any]) -> Any:
    """When a relayed failure began (RankRecord.began): failed_at, else ended_at."""
    failed_at = failure.get("failed_at")
    return failed_at if failed_at is not None else failure.get("ended_at")


def earlier(
    new: Mapping[str, Any], new_skew: float | None, old: Mapping[str, Any], old_skew: float | None
) -> bool:
    """Whether failure `new` began before `old`, where both hosts' clocks allow saying so (each
    measured and within CLOCK_TOLERANCE of the master's); else arrival order stands."""
    new_end, old_end = began(new), began(old)
    if not isinstance(new_end, int | float) or not isinstance(old_end, int | float):
        return False
    if new_skew is None or old_skew is None:
        return False
    if abs(new_skew) > CLOCK_TOLERANCE or abs(old_skew) > CLOCK_TOLERANCE:
        return False
    return new_end + new_skew < old_end + old_skew
