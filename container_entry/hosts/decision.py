"""The master's decision on the job's first failure. The first to arrive stops every other
host at once; one that arrives later but ended earlier, by the ranks' own clocks corrected by
what the heartbeats showed of each host's clock, takes its place. The decision is final once
every host still in the job settled (posted what of its own may be first, or finished), or
SETTLE_SECONDS after the first failure; hosts write their first line from the final decision
only, so every host writes the same one, whichever host it is on and whenever its own ranks
ended (a host that read an earlier word while a later post still changed it wrote another)."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Mapping
from typing import Any

from container_entry.common.records import began
from container_entry.hosts.schema import Relayed

CLOCK_TOLERANCE = 5.0  # seconds: a host whose clock seems further off is ordered by arrival
# seconds after the first failure: a host that has not settled by then (its ranks slow to
# stop, or frozen until the liveness timeout) no longer holds the others' first line. A
# failing host settles after its teardown (stacks, FAILURE_GRACE_PERIOD's 5 s, the records),
# and only then may it post the rank whose failure began first (a victim can end first): 3 s
# cut that off on a loaded machine. Hosts end together anyway: waiting costs the job nothing.
SETTLE_SECONDS = 15.0


class Change(enum.Enum):
    """What a failure offered to the decision changed."""

    NONE = "none"  # the decision stands
    FIRST = "first"  # the job's first failure: every other host must stop now
    EARLIER = "earlier"  # it ended before the one decided: it takes its place


class FirstFailure:
    """The decision, changed on the master's loop thread and read from any (`failure`)."""

    def __init__(self, settle_seconds: float = SETTLE_SECONDS) -> None:
        self.settle_seconds = settle_seconds
        self.failure: Relayed | None = None
        self.skew: float | None = None  # its poster's clock, as `earlier` needs it
        self.since: float | None = None  # when the first failure arrived (monotonic)
        self.final = False  # told to every host as final: no failure changes it any more
        self.lock = threading.Lock()

    def offer(self, failure: Relayed, skew: float | None) -> Change:
        """A failure posted by a host whose clock is `skew` behind the master's (None: not
        measured yet)."""
        with self.lock:
            decided = self.failure
            if self.final:
                return Change.NONE
            if decided is None:
                change = Change.FIRST
                self.since = time.monotonic()
            elif earlier(failure, skew, decided, self.skew):
                change = Change.EARLIER
            else:
                return Change.NONE
            self.failure, self.skew = failure, skew
        return change

    def settle(self, everyone_settled: bool, now: float) -> bool:
        """Whether the decision becomes final now (then it is, and the caller tells every
        host): there is one, not final yet, and every host settled or the wait is over."""
        with self.lock:
            if self.failure is None or self.final or self.since is None:
                return False
            if not everyone_settled and now - self.since < self.settle_seconds:
                return False
            self.final = True
            return True


def earlier(
    new: Mapping[str, Any], new_skew: float | None, old: Mapping[str, Any], old_skew: float | None
) -> bool:
    """Whether failure `new` began before `old`, where both hosts' clocks allow saying so (each
    measured and within CLOCK_TOLERANCE of the master's); else arrival order stands."""
    new_end = began(new.get("failed_at"), new.get("ended_at"), new.get("exception"))
    old_end = began(old.get("failed_at"), old.get("ended_at"), old.get("exception"))
    if not isinstance(new_end, int | float) or not isinstance(old_end, int | float):
        return False
    if new_skew is None or old_skew is None:
        return False
    if abs(new_skew) > CLOCK_TOLERANCE or abs(old_skew) > CLOCK_TOLERANCE:
        return False
    return new_end + new_skew < old_end + old_skew
