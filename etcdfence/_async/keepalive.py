"""Every lease of one client kept alive on one ``LeaseKeepAlive`` stream.

A session registers its lease here (:meth:`AsyncKeepAlives.add`); one background
worker per client sends each lease's keepalive every TTL/3 on one shared stream and
matches answers to leases by id, and one more watches every lease's *local deadline*:
send time of the last acknowledged keepalive + granted TTL − margin. What happens to
one lease — an answer, etcd saying it is gone (TTL ≤ 0), its deadline passing —
touches only that lease's session. A member that stops answering any lease within
half an interval is failed over, the stream reopened elsewhere and every lease
renewed there at once. So 10,000 sessions cost one stream and two workers, not
10,000 streams and 20,000 workers.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._wire import messages as m
from ..errors import UnavailableError
from . import _compat
from .connection import AsyncConnection, EtcdStream


@dataclass(eq=False)
class KeptLease:
    """One registered lease: its schedule, deadline and what to tell its session."""

    lease_id: int
    ttl: int
    margin: float
    deadline: float
    on_gone: Callable[[str], Any]
    interval: float = 0.0
    next_due: float = 0.0
    sent: int = 0  # keepalives sent (for the session's counter)
    answered: int = 0  # answers received on the current stream
    asked: int = 0  # requests sent on the current stream
    sent_at: list[float] = field(default_factory=list)  # unanswered sends (a few at most)
    renew: bool = True  # False once orphaned: no more keepalives, the deadline still runs

    def __post_init__(self) -> None:
        self.interval = max(self.ttl / 3.0, 0.1)


class AsyncKeepAlives:
    """The client's keepalive hub (see the module docstring). Get it from
    ``client.connection``'s owner; sessions use :meth:`add` and :meth:`remove`."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn
        self._leases: dict[int, KeptLease] = {}
        self._guard = threading.Lock()
        self._due: list[tuple[float, int]] = []  # (next keepalive, lease id), lazy
        self._deadlines: list[tuple[float, int]] = []  # (local deadline, lease id), lazy
        # Unanswered keepalives: (patience ends, lease id, seq) until their patience ends,
        # then (patience, lease id, seq) in _overdue, where the strictest comes first.
        self._pending: list[tuple[float, int, int]] = []
        self._overdue: list[tuple[float, int, int]] = []
        self._last_answer = 0.0  # when the stream last answered any keepalive
        self._wake = _compat.Event()  # the stream loop: something to send or a new lease
        self._deadline_wake = _compat.Event()  # the deadline loop: a new (earlier) deadline
        self._stop = _compat.Event()
        self._workers: list[_compat.Background] = []

    def add(self, lease: KeptLease) -> None:
        """Keep ``lease`` alive from now on (its first keepalive goes out at once)."""
        with self._guard:
            lease.next_due = _compat.monotonic() + lease.interval
            self._leases[lease.lease_id] = lease
            heapq.heappush(self._due, (lease.next_due, lease.lease_id))
            heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id))
            start = not self._workers
            if start:
                self._stop.clear()
                self._workers = [
                    _compat.Background(self._stream_loop, name="etcdfence-keepalives"),
                    _compat.Background(self._deadline_loop, name="etcdfence-deadlines"),
                ]
        self._wake.set()
        self._deadline_wake.set()

    def remove(self, lease_id: int) -> None:
        """Stop keeping ``lease_id`` alive (it runs out by its TTL unless revoked)."""
        with self._guard:
            self._leases.pop(lease_id, None)

    def orphan(self, lease_id: int) -> None:
        """Stop renewing ``lease_id`` but keep watching its local deadline."""
        with self._guard:
            lease = self._leases.get(lease_id)
            if lease is not None:
                lease.renew = False

    async def aclose(self) -> None:
        """Stop both workers (the client is closing)."""
        self._stop.set()
        self._wake.set()
        self._deadline_wake.set()
        with self._guard:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.cancel()
        for worker in workers:
            await worker.join(2.0)

    def __len__(self) -> int:
        return len(self._leases)

    # -- the stream ---------------------------------------------------------------------

    async def _stream_loop(self) -> None:
        await self._conn.keep_stream(
            "LeaseKeepAlive", self._serve, stop=self._stop, max_backoff=0.2
        )

    async def _serve(self, stream: EtcdStream) -> None:
        """Send what is due, read answers in the background, fail over a silent member."""
        self._restart_schedule()
        broken: list[BaseException] = []
        reader = _compat.Background(self._read, stream, broken, name="etcdfence-keepalive-read")
        try:
            while not self._stop.is_set():
                if broken:
                    raise broken[0]
                now = _compat.monotonic()
                if self._silent(now, stream.endpoint):
                    await self._conn.fail_over(stream.endpoint)
                    raise UnavailableError(
                        f"no keepalive answer from {self._conn.endpoints[stream.endpoint]}"
                    )
                for lease in self._take_due(now):
                    lease.asked += 1
                    lease.sent += 1
                    lease.sent_at.append(now)
                    self._expect_answer(now, lease)
                    await stream.write(m.LeaseKeepAliveRequest(ID=lease.lease_id))
                self._wake.clear()
                await _compat.wait_event(self._wake, self._next_wakeup(now, stream.endpoint))
        finally:
            stream.cancel()
            reader.cancel()

    async def _read(self, stream: EtcdStream, broken: list[BaseException]) -> None:
        try:
            while True:
                response = await stream.read()
                if response is None:
                    raise UnavailableError("etcd closed the keepalive stream")
                self._answered(int(response.ID), int(response.TTL))
        except BaseException as err:  # the writer loop raises it (and the stream reopens)
            broken.append(err)
            self._wake.set()

    def _answered(self, lease_id: int, ttl: int) -> None:
        now = self._last_answer = _compat.monotonic()
        with self._guard:
            lease = self._leases.get(lease_id)
            if lease is None or not lease.sent_at:
                return
            lease.answered += 1
            sent = lease.sent_at.pop(0)
        if ttl <= 0:
            self.remove(lease_id)
            lease.on_gone("lease expired or revoked on the server")
            return
        deadline = sent + ttl - lease.margin
        # A deadline that has passed is final: the session already answers "expired" to
        # any read (session._lost), whatever arrives late; an answer must not revive it.
        if deadline > lease.deadline > now:
            lease.deadline = deadline
            with self._guard:
                heapq.heappush(self._deadlines, (deadline, lease_id))

    def _restart_schedule(self) -> None:
        """A new stream: nothing is outstanding on it; renew every lease now."""
        now = _compat.monotonic()
        self._last_answer = now
        with self._guard:
            self._pending.clear()
            self._overdue.clear()
            self._due = []
            for lease in self._leases.values():
                lease.sent_at.clear()
                lease.asked = lease.answered = 0
                lease.next_due = now
                self._due.append((now, lease.lease_id))
            heapq.heapify(self._due)

    def _take_due(self, now: float) -> list[KeptLease]:
        due = []
        with self._guard:
            while self._due and self._due[0][0] <= now:
                when, lease_id = heapq.heappop(self._due)
                lease = self._leases.get(lease_id)
                if lease is None or lease.next_due != when or not lease.renew:
                    continue  # removed, orphaned, or rescheduled (a stale heap entry)
                lease.next_due = now + lease.interval
                heapq.heappush(self._due, (lease.next_due, lease_id))
                due.append(lease)
        return due

    def _expect_answer(self, now: float, lease: KeptLease) -> None:
        """A keepalive of ``lease`` was just sent: its patience (half an interval) runs."""
        with self._guard:
            heapq.heappush(self._pending, (now + lease.interval / 2, lease.lease_id, lease.asked))

    def _unanswered(self, lease_id: int, seq: int) -> KeptLease | None:
        """The lease if its keepalive number ``seq`` is still unanswered (guard held)."""
        lease = self._leases.get(lease_id)
        return None if lease is None or lease.answered >= seq else lease

    def _strictest_overdue(self, now: float) -> float | None:
        """The shortest patience among the unanswered keepalives whose own patience has
        run out by ``now`` (``None`` if there are none). Called with the guard held.

        Sessions of different TTLs share the stream: a 60 s lease's keepalive waits
        10 s for its answer, a 10 s lease's 1.7 s. The member is judged by the
        strictest of them, not by whichever was sent first, or a silent member costs
        the short lease its deadline while the long lease's patience runs."""
        while self._pending and self._pending[0][0] <= now:
            _, lease_id, seq = heapq.heappop(self._pending)
            lease = self._unanswered(lease_id, seq)
            if lease is not None:
                heapq.heappush(self._overdue, (lease.interval / 2, lease_id, seq))
        while self._overdue:
            patience, lease_id, seq = self._overdue[0]
            if self._unanswered(lease_id, seq) is not None:
                return patience
            heapq.heappop(self._overdue)
        return None

    def _silent(self, now: float, endpoint: int) -> bool:
        """Whether the member went silent: a keepalive is unanswered past its patience
        *and* the member answered nothing at all — no keepalive, call or watch message —
        within that patience (the strictest patience among the overdue keepalives). A
        member that answers, if slowly, under a burst of thousands of renewals or grants
        is not failed over; one that stopped answering (frozen, cut off) is."""
        heard = max(self._last_answer, self._conn.heard_from(endpoint))
        with self._guard:
            patience = self._strictest_overdue(now)
        return patience is not None and now >= heard + patience

    def _next_wakeup(self, now: float, endpoint: int) -> float:
        heard = max(self._last_answer, self._conn.heard_from(endpoint))
        with self._guard:
            times = [self._due[0][0]] if self._due else []
            if self._pending:  # the next keepalive whose patience runs out
                times.append(self._pending[0][0])
            if self._overdue:  # the strictest overdue one, counted from the last answer
                times.append(heard + self._overdue[0][0])
        return max(0.001, min(times) - now) if times else 1.0

    # -- local deadlines ---------------------------------------------------------------------

    async def _deadline_loop(self) -> None:
        while not self._stop.is_set():
            now = _compat.monotonic()
            expired: list[KeptLease] = []
            with self._guard:
                while self._deadlines and self._deadlines[0][0] <= now:
                    _, lease_id = heapq.heappop(self._deadlines)
                    lease = self._leases.get(lease_id)
                    if lease is not None and lease.deadline <= now:
                        expired.append(lease)
                wait = (self._deadlines[0][0] - now) if self._deadlines else 1.0
            for lease in expired:
                self.remove(lease.lease_id)
                lease.on_gone("local deadline passed (no keepalive acknowledged in time)")
            self._deadline_wake.clear()
            if not self._stop.is_set():
                await _compat.wait_event(self._deadline_wake, min(max(wait, 0.0), 1.0))
