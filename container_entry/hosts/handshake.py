"""Both halves of the side channel's challenge-response (the key never sent):

  master -> {"type": "hello", "version": 1, "nonce": N}              at once, to every connection
  member -> {"type": "join", "host", "machine", "workers", "nonce": M,
             "proof": HMAC(key, join, N, M, host, machine, workers)}
  master -> {"type": "welcome", "proof": HMAC(key, welcome, M, N, host)}    once admitted

The master proves itself only after the member did, so nothing answers a stranger's guesses;
both challenges in each proof mean a recorded answer cannot be replayed."""

from __future__ import annotations

import re

from container_entry.hosts.keys import (
    KEY_ADVICE,
    join_proof,
    new_nonce,
    same,
    welcome_proof,
)
from container_entry.hosts.messages import Hello, Join, Refused, Welcome
from container_entry.hosts.wire import PROTOCOL, MessageKind

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # never into our log lines


# -- the master's half ----------------------------------------------------------------------


def hello(nonce: str) -> Hello:
    """The challenge every new connection gets at once."""
    return Hello(type=MessageKind.HELLO, version=PROTOCOL, nonce=nonce)


def proven(key: bytes, nonce: str, join: Join) -> bool:
    """Whether a join proves the key, against this connection's challenge."""
    expected = join_proof(key, nonce, join["nonce"], join["host"], join["machine"], join["workers"])
    return same(expected, join["proof"])


def welcome(key: bytes, nonce: str, member_nonce: str, host: str) -> Welcome:
    """The master's answer to an admitted join: its own proof."""
    return Welcome(type=MessageKind.WELCOME, proof=welcome_proof(key, member_nonce, nonce, host))


# -- a member's half ------------------------------------------------------------------------


class Refusal(Exception):
    """The join cannot be: the text says why, in the member's words."""


class MemberHandshake:
    """A member's half: its challenge, a proven join in answer to the master's hello, the
    master's welcome checked. Nothing from the master counts until `trusted`."""

    def __init__(
        self, key: bytes, host: str, machine: str | None, workers: int, master: str, port: int
    ) -> None:
        self.key, self.host, self.machine, self.workers = key, host, machine, workers
        self.where = f"{master}:{port}"  # the side channel, for the refusals' words
        self.master = master
        self.nonce = new_nonce()  # this host's challenge to the master
        self.master_nonce: str | None = None  # the master's, once its hello came
        self.trusted = False  # the master proved it holds the key

    @property
    def answered(self) -> bool:
        return self.master_nonce is not None

    def answer(self, hello: Hello) -> Join:
        """The join that answers the master's hello; Refusal for another protocol."""
        if hello["version"] != PROTOCOL:
            raise Refusal(
                f"the side channel at {self.where} speaks protocol {hello['version']}, this host "
                f"{PROTOCOL}: every host must run the same image"
            )
        self.master_nonce = hello["nonce"]
        proof = join_proof(
            self.key, self.master_nonce, self.nonce, self.host, self.machine, self.workers
        )
        return Join(
            type=MessageKind.JOIN,
            host=self.host,
            machine=self.machine,
            workers=self.workers,
            nonce=self.nonce,
            proof=proof,
        )

    def check(self, welcome: Welcome) -> None:
        """Trust the master once its welcome proves the key; Refusal if it does not."""
        assert self.master_nonce is not None, "a welcome before our join"
        expected = welcome_proof(self.key, self.nonce, self.master_nonce, self.host)
        if not same(expected, welcome["proof"]):
            raise Refusal(
                f"the side channel at {self.where} is not this job's master (its proof is "
                f"wrong): {KEY_ADVICE}"
            )
        self.trusted = True

    def refused(self, refused: Refused) -> Refusal:
        """The master's refusal of this host, in words (its reason shown safely)."""
        reason = _CONTROL.sub("?", refused["reason"])
        words = f"the master host {self.master} refused this host ({reason})"
        return Refusal(words + (f": {KEY_ADVICE}" if "proof" in reason else ""))
