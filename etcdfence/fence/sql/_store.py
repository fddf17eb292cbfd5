"""The SQL fence as the engine's :class:`~etcdfence.fence._sync.engine.Store`: one
attempt is one transaction that checks (or claims) the mark under its row lock and
applies the key/value writes.

An attempt made while the fence *holds* (a guarded block, or put/delete/txn) leaves its
transaction open when it applied: the caller runs its block, commits, and then tells the
writer (``acknowledged``, or ``lost`` when the COMMIT got no answer). Any other attempt
(``fence_off``, the quick fence-off after a lost answer) commits before it returns.

Why a claim here needs no compare-and-set (etcd and Redis claim against the mark the
writer was shown, so that a claim + write delayed in the network is refused after the
writer moved on): an SQL claim and its write run in one explicit transaction, under
the mark's row lock, and only the client's COMMIT makes them durable — which the client
sends only after the check's answer came back. A statement held in the network past
the client's timeout therefore runs, if ever, in a transaction the client never
commits: whatever the client sends after it on that connection (a ROLLBACK, or the
close) arrives after it, in order, and the server rolls it back. A COMMIT that is
itself held keeps the mark's row locked until it lands or the server drops the
connection, so the quick fence-off and every later write of the resource wait for it:
it lands before them or not at all.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ...errors import ConsistencyError, EtcdfenceError, KeyExistsError
from .._sync.engine import Lost, Reply
from ..epochs import claim_after
from ._session import Session, close_quietly
from .dialect import NONE

__all__ = ["Row", "SQLStore"]

# Attempts for the check step when the database reports a deadlock or a serialization
# failure (only before the caller's block has run).
_CHECK_ATTEMPTS = 8

#: One key/value write: ``("put", key, value)``, ``("create", key, value)`` (a put
#: only if the key is absent), ``("delete", key, None)`` or ``("range", low, high)``
#: (``high`` None: to the end).
Row = tuple[str, bytes, bytes | None]


class SQLStore:
    """The engine's store for one resource of one :class:`Session`."""

    def __init__(self, session: Session, resource: str) -> None:
        self.session = session
        self.resource = resource
        self.backend = session.dialect.name
        #: No request timeout of its own: a claim waits for the mark's row lock as long
        #: as the server lets it (its lock timeout), unless a timeout is given.
        self.timeout = math.inf
        self.held: Any = None  # the cursor of the transaction a holding attempt left open
        self.kind = NONE

    @contextmanager
    def holding(self, cursor: Any) -> Iterator[None]:
        """Attempts inside leave their applied transaction open on ``cursor``."""
        self.held, self.kind = cursor, NONE
        try:
            yield
        finally:
            self.held = None

    def attempt(
        self,
        token: int,
        epoch: int | None,
        ops: Sequence[Row] | None,
        hint: Reply | None,
        timeout: float | None,
    ) -> Reply:
        """Check (``epoch`` given) or claim (``epoch`` None) the mark and apply ``ops``
        in one transaction; commit it unless holding."""
        held = self.held
        with self.session.translated():
            cur = held if held is not None else self.session.conn.cursor()
        seconds = None if timeout is None or not math.isfinite(timeout) else timeout
        try:
            with self.session.translated():
                kind, mark, version = self._check(cur, token, epoch, ops, seconds)
            if mark[0] != token or (epoch is not None and mark[1] != epoch):
                return Reply(False, mark=mark)  # rolled back
            if held is not None:
                self.kind = kind
            else:
                self._commit(cur, kind)
            return Reply(True, epoch=mark[1], mark=mark, version=version)
        finally:
            if held is None:
                close_quietly(cur)

    def _commit(self, cur: Any, kind: int) -> None:
        session = self.session
        try:
            session.end(cur, kind, commit=True)
        except BaseException as exc:
            session.rollback_quietly(cur, kind)
            if session.dialect.not_committed(session.conn, exc) or kind == NONE:
                if isinstance(exc, Exception) and not isinstance(exc, EtcdfenceError):
                    raise session.dialect.translate(session.conn, exc) from exc
                raise
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: never swallowed
            raise Lost(exc) from exc

    def _check(
        self,
        cur: Any,
        token: int,
        epoch: int | None,
        ops: Sequence[Row] | None,
        seconds: float | None,
    ) -> tuple[int, tuple[int, int], int]:
        """Open the transaction and check or claim; return how it was opened, the mark
        after the check and the version after ``ops``. A refused check is rolled back.
        Deadlocks and serialization failures are retried in a fresh transaction (nothing
        of the caller's ran yet)."""
        session, dialect = self.session, self.session.dialect
        attempt = 0
        with dialect.lock_wait(cur, seconds):
            while True:
                attempt += 1
                kind = session.begin(cur, write=True)
                try:
                    if seconds is not None:
                        dialect.in_transaction_lock_wait(cur, seconds)
                    if epoch is None:
                        mark = self._claim(cur, token)
                        accepted = mark[0] == token
                    else:
                        mark = self._advance(cur, token, epoch)
                        accepted = mark == (token, epoch)
                    if not accepted:
                        session.rollback_quietly(cur, kind)
                        return kind, mark, 0
                    return kind, mark, 0 if ops is None else self._apply(cur, ops)
                except BaseException as exc:
                    session.rollback_quietly(cur, kind)
                    if attempt >= _CHECK_ATTEMPTS or not dialect.is_transient(exc):
                        raise
                time.sleep(random.uniform(0, min(0.1, 0.002 * 2**attempt)))

    def _claim(self, cur: Any, token: int) -> tuple[int, int]:
        """Claim an epoch of ``token`` in the open transaction: lock the mark's row
        without changing it (an upsert offering ``(0, 0)``, below every mark; it creates
        a missing row, which commits only with the claim), read it, and move it to the
        smallest mark above it. Returns the mark afterwards; one above ``token`` (left as
        it was) means stale."""
        before = self._advance(cur, 0, 0)
        if before[0] > token:
            return before
        target = claim_after(token, *before)
        after = self._advance(cur, *target)
        if after != target:  # we hold the row lock: nobody can have moved it
            raise ConsistencyError(f"claim on {self.resource!r} read mark {after}, not {target}")
        return after

    def _advance(self, cur: Any, token: int, epoch: int) -> tuple[int, int]:
        """Advance the mark to ``max(mark, (token, epoch))`` under a row lock held until
        the transaction ends; the mark afterwards (``(token, epoch)`` iff accepted)."""
        sql = self.session.sql
        mark = self.session.dialect.check_and_advance(cur, sql, self.resource, token, epoch)
        if mark is None:
            cur.execute(sql.select, (self.resource,))
            row = cur.fetchone()
            if row is None:  # cannot happen: the upsert created or locked the row
                raise ConsistencyError(f"fence row for {self.resource!r} missing after upsert")
            mark = (int(row[0]), int(row[1]))
        if mark < (token, epoch):  # the upsert leaves max(mark, ours)
            raise ConsistencyError(
                f"fence check for {self.resource!r} read mark {mark} below {(token, epoch)}"
            )
        return mark

    def _apply(self, cur: Any, ops: Sequence[Row]) -> int:
        """Apply the key/value writes and count them in the resource's version.

        Creates look their keys up first, before any write: the mark's row lock (taken
        by the check) serializes every fenced writer of the resource, so a key absent
        now stays absent until the COMMIT — no INSERT that could fail (which would
        abort a PostgreSQL transaction), no gap locks on MySQL (the lookup is a plain
        read, its snapshot taken after the lock). One that exists raises
        :class:`~etcdfence.errors.KeyExistsError`; the caller rolls back, mark included."""
        sql, r = self.session.sql, self.resource
        for verb, key, _ in ops:
            if verb == "create":
                cur.execute(sql.get, (r, key))
                row = cur.fetchone()
                if row is not None:
                    raise KeyExistsError(r, key, bytes(row[0]))
        for verb, key, arg in ops:
            if verb in ("put", "create"):
                cur.execute(sql.put, (r, key, arg))
            elif verb == "delete":
                cur.execute(sql.delete, (r, key))
            elif arg is None:
                cur.execute(sql.delete_from, (r, key))
            else:
                cur.execute(sql.delete_range, (r, key, arg))
        cur.execute(sql.bump_version, (r,))
        cur.execute(sql.select_version, (r,))
        row = cur.fetchone()
        return int(row[0])

    # -- repair (the store side of etcdfence.fence._sync.engine.repair) ---------------

    def read_mark(self) -> tuple[int, int]:
        """The mark as ``(token, epoch)``; ``(0, 0)`` if none."""
        row = self.session.read(self.session.sql.select, (self.resource,))
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def lower(self, expected: tuple[int, int], new: tuple[int, int]) -> tuple[int, int]:
        """Set the mark to ``new`` if it is exactly ``expected`` (one ``UPDATE ...
        WHERE token = ? AND epoch = ?``, committed); the mark found. The version and the
        data rows are not touched."""
        session, sql = self.session, self.session.sql
        row: Any = None
        with session.exclusive(), session.translated():
            cur = session.conn.cursor()
            try:
                kind = session.begin(cur, write=True)
                try:
                    cur.execute(sql.lower, (*new, self.resource, *expected))
                    lowered = cur.rowcount == 1
                    if not lowered:
                        cur.execute(sql.select, (self.resource,))
                        row = cur.fetchone()
                    session.end(cur, kind, commit=True)
                except BaseException:
                    session.rollback_quietly(cur, kind)
                    raise
            finally:
                close_quietly(cur)
        if lowered:
            return expected
        return (0, 0) if row is None else (int(row[0]), int(row[1]))
