"""The cursor a guarded block gets (:meth:`SQLFence.guarded`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from ...errors import InvalidArgumentError, TransactionAbortedError
from .dialect import TXN_NONE

__all__ = ["GuardedCursor"]

# Statements that end or restart the transaction; refused inside a guarded block.
_TXN_CONTROL = re.compile(
    r"\s*(COMMIT|ROLLBACK(?!\s+(?:WORK\s+)?TO\b)|BEGIN|START\s+TRANSACTION|END|ABORT"
    r"|PREPARE\s+TRANSACTION|XA|SET\s+(?:SESSION\s+|@@SESSION\.|@@)?AUTOCOMMIT)\b",
    re.IGNORECASE,
)


class GuardedCursor:
    """The cursor a :meth:`SQLFence.guarded` block gets: a thin wrapper that notices
    failed statements and the transaction ending, so the fence never commits a block
    that cannot commit whole. Everything else is passed through to the driver's cursor.
    """

    def __init__(self, cursor: Any, state: Callable[[], int]) -> None:
        self._cursor = cursor
        self._state = state
        self.failure: BaseException | None = None  # the first statement that failed
        self.ended: str | None = None  # what ended the transaction inside the block
        self.closed_by_fence = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)

    def __enter__(self) -> GuardedCursor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<guarded {self._cursor!r}>"

    def close(self) -> None:
        """Close the driver's cursor (the fence's own transaction is unaffected)."""
        self._cursor.close()

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """``cursor.execute`` of the driver, inside the guarded transaction."""
        return self._run("execute", args, kwargs)

    def executemany(self, *args: Any, **kwargs: Any) -> Any:
        """``cursor.executemany`` of the driver, inside the guarded transaction."""
        return self._run("executemany", args, kwargs)

    def callproc(self, *args: Any, **kwargs: Any) -> Any:
        """``cursor.callproc`` of the driver, inside the guarded transaction."""
        return self._run("callproc", args, kwargs)

    def executescript(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: sqlite3's ``executescript`` commits the open transaction first."""
        return self._refuse("executescript() (sqlite3 commits before running the script)")

    def _refuse(self, what: str) -> Any:
        exc = InvalidArgumentError(
            f"{what} is not allowed inside a guarded block: the fence commits or rolls "
            "back when the block ends"
        )
        if self.failure is None:
            self.failure = exc
        raise exc

    def _run(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.closed_by_fence:
            raise InvalidArgumentError("the guarded block has ended; this cursor is closed")
        if self.failure is not None or self.ended is not None:
            raise TransactionAbortedError(
                "an earlier statement of this guarded block failed or ended its "
                "transaction; the block will not commit, further statements are refused"
            ) from self.failure
        operation = args[0] if args else None
        if isinstance(operation, bytes):
            operation = operation.decode("utf-8", "replace")
        if isinstance(operation, str):
            verb = _TXN_CONTROL.match(operation)
            if verb is not None:
                self._refuse(verb.group(1).upper())
        try:
            result = getattr(self._cursor, method)(*args, **kwargs)
        except BaseException as exc:
            self.failure = exc
            raise
        if self._state() == TXN_NONE:
            # e.g. DDL on MySQL commits implicitly; a COMMIT hidden behind a comment
            text = operation if isinstance(operation, str) else repr(operation)
            self.ended = f"by {' '.join(text.split())[:60]!r}"
        return self if result is self._cursor else result
