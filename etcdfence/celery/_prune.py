"""Pruning the workers' applied-slot keys (``<prefix>slots/<entry>@<time>``).

A worker creates a slot's key atomically with the slot's effect; while the key exists a
second delivery of the slot writes nothing. Deleting it is safe once no message that a
worker would still accept can name the slot any more. The leader of term T deletes the
key of slot S only when all of these hold:

1. S is at or before the entry's last slot recorded when T was elected: T sends new
   slots only after it, and every later term only after a recorded slot at least as
   late (the recorded slot never goes back: only the current term records, through the
   state fence);
2. T was not elected with S to resend, so T never sends S at all; every copy of S
   in a queue carries an older term's token, which the workers refuse as stale (their
   mark was advanced to T before T published anything);
3. S's SENT record is gone from etcd (a term deletes a SENT record once it is older
   than ``etcdfence_resend_window``; T knows every SENT record there is, as it read
   them at election and only T writes them since): no later term resends S (a new
   leader resends only the slots of SENT records it finds, and nothing records S as
   sent again: T does not send it, older terms cannot record). Waiting for the delete,
   rather than comparing send times, keeps two beats' clocks out of it;
4. the key was created by a delivery of an older term (its value's ``token`` < T),
   a belt-and-braces check of 2.

The deletes go through the schedule state's fence with T's token: a beat that lost its
term (a zombie) cannot prune — its transaction fails, and it drops the term. The work is
bounded: one page of at most ``_PAGE`` keys read and at most that many deleted (one
transaction) per step, a step at most every ``_STEP_EVERY`` seconds from the beat's
tick; a pass over every key starts again ``_PASS_EVERY`` seconds after the last one
ended. A term's own slots are pruned by the next term (this term cannot tell when
the copies it sent itself — a redelivery, a queued duplicate — are gone).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field
from typing import Any

from .. import metrics
from .._keys import prefix_range_end
from .._sync.client import Client
from .._wire import messages as m
from ..fence.ops import Delete
from ..token import FencingToken
from ._config import Settings
from ._slots import parse_time

__all__ = ["SlotPruner"]

log = metrics.log
#: Slot keys read (and at most deleted, in one transaction) per step.
_PAGE = 100
#: Seconds between two steps of a pass.
_STEP_EVERY = 1.0
#: Seconds between the end of a pass and the start of the next.
_PASS_EVERY = 30.0


@dataclass
class SlotPruner:
    """The slot-key pruning of one term (see the module docstring)."""

    client: Client
    settings: Settings
    token: FencingToken
    #: quoted entry name -> the entry's last slot recorded when the term began
    recorded: dict[str, dt.datetime]
    #: quoted slot ids the term was elected to resend (it sends these: never pruned)
    resent: frozenset[str]
    #: the SENT records in etcd (key -> unix send time), kept current by the beat
    sent: dict[str, float]
    cursor: bytes = b""
    next_step: float = 0.0
    pruned: int = field(default=0)

    @classmethod
    def read(
        cls,
        client: Client,
        s: Settings,
        token: FencingToken,
        resent: frozenset[str],
        sent: dict[str, float],
    ) -> SlotPruner:
        """The pruner of a term that just began: reads every entry's recorded slot."""
        head = f"{s.prefix}schedule/"
        recorded: dict[str, dt.datetime] = {}
        for kv in client.get_prefix(head, timeout=s.timeout):
            try:
                at = parse_time(json.loads(kv.value)["slot"])
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # unreadable: that entry's slots are not pruned
            recorded[kv.key.decode("utf-8", "replace")[len(head) :]] = at
        return cls(client, s, token, recorded, resent, sent)

    def due(self) -> bool:
        return time.monotonic() >= self.next_step

    def step(self, state: Any) -> int:
        """Read one page of slot keys and delete the prunable ones through the state
        fence (``state``); return how many were deleted. A newer term's fence raises
        :class:`~etcdfence.errors.StaleTokenError` (the caller drops the term)."""
        s = self.settings
        head = f"{s.prefix}slots/".encode()
        start = self.cursor or head
        request = m.RangeRequest(key=start, range_end=prefix_range_end(head), limit=_PAGE)
        reply = self.client.connection.call("Range", request, timeout=s.timeout, idempotent=True)
        doomed = [kv.key for kv in reply.kvs if self._prunable(kv, len(head))]
        if doomed:
            state.txn(self.token, [Delete(k) for k in doomed])
            self.pruned += len(doomed)
            log.info(
                "etcdfence.celery_slots_pruned",
                keys=len(doomed),
                total=self.pruned,
                token=self.token.value,
            )
        if reply.more and reply.kvs:
            self.cursor = bytes(reply.kvs[-1].key) + b"\x00"
            self.next_step = time.monotonic() + _STEP_EVERY
        else:  # the pass is over
            self.cursor = b""
            self.next_step = time.monotonic() + _PASS_EVERY
        return len(doomed)

    def _prunable(self, kv: Any, head: int) -> bool:
        slot = bytes(kv.key)[head:].decode("utf-8", "replace")
        entry, _, when = slot.rpartition("@")
        recorded = self.recorded.get(entry)
        if recorded is None or slot in self.resent:
            return False
        try:
            at = parse_time(when)
            token = json.loads(kv.value)["token"]
        except (ValueError, KeyError, TypeError):
            return False  # not a key a worker of ours wrote: left alone
        if at > recorded or not isinstance(token, int) or token >= self.token.value:
            return False
        return f"{self.settings.sent_prefix()}{entry}/{slot}" not in self.sent
