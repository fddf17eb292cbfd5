"""The observer: the ground truth of a run, every change etcd made under the run's root.

Use an :class:`Observer` next to the contenders (on its own client) and hand it to
:meth:`~etcdfence.history.History.collect`; :func:`leader_changes` derives from its
changes who really led an election, and when.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from ..errors import CompactedError, EtcdfenceError
from .events import Change
from .layout import Layout


class Observer:
    """Collect every change under ``layout.watch_prefix`` from ``start_revision``.

    Runs a watch on a sync :class:`~etcdfence.Client` in a daemon thread. Pass a
    ``start_revision`` at or before the first write of the run (``client.revision()``
    taken before it starts, plus one); revision 1 works on a cluster that was never
    compacted. The watch survives broken streams and member failures; if it falls
    behind a compaction, :attr:`error` is set and the history is incomplete.
    """

    def __init__(self, client: Any, layout: Layout, *, start_revision: int = 1) -> None:
        self.layout = layout
        self.start_revision = start_revision
        self._client = client
        self._changes: list[Change] = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._revision = start_revision - 1
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def changes(self) -> list[Change]:
        """Every change seen so far, in revision order."""
        with self._lock:
            return list(self._changes)

    @property
    def revision(self) -> int:
        """The highest revision delivered so far."""
        with self._lock:
            return self._revision

    def start(self) -> Observer:
        """Start watching in a daemon thread (also done by ``with``)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="etcdfence-observer", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        watch = self._client.watch(
            self.layout.watch_prefix, prefix=True, start_revision=self.start_revision
        )
        try:
            watch.start()
            while not self._stop.is_set():
                try:
                    batch = watch.get(0.1)
                except TimeoutError:
                    continue
                except StopIteration:
                    return
                changes = [
                    Change(
                        revision=ev.kv.mod_revision or batch.revision,
                        key=ev.kv.key.decode("utf-8", "replace"),
                        value=ev.kv.value.decode("utf-8", "replace"),
                        deleted=ev.type == "delete",
                        create_revision=ev.kv.create_revision,
                        lease=ev.kv.lease_id,
                    )
                    for ev in batch.events
                ]
                with self._cond:
                    self._changes.extend(changes)
                    top = max([c.revision for c in changes] + [batch.revision])
                    self._revision = max(self._revision, top)
                    self._cond.notify_all()
        except (CompactedError, EtcdfenceError) as err:
            self.error = err
            with self._cond:
                self._cond.notify_all()
        finally:
            watch.close()

    def wait_for(self, revision: int, timeout: float = 10.0) -> bool:
        """Wait until changes up to ``revision`` were delivered (needs a change at or
        after it under the root, e.g. a sentinel put); return whether they were."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._revision < revision and self.error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return self._revision >= revision

    def sync(self, timeout: float = 10.0) -> int:
        """Put a sentinel key under the root and wait until the watch delivered it;
        returns its revision. Raises :class:`TimeoutError` if it does not arrive."""
        revision = int(self._client.put(self.layout.root + "/observer-sync", "sync"))
        if not self.wait_for(revision, timeout):
            raise TimeoutError(
                f"observer did not reach revision {revision} within {timeout}s"
                + (f" ({self.error})" if self.error else "")
            )
        return revision

    def stop(self) -> None:
        """Stop watching; :attr:`changes` stays available."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def __enter__(self) -> Observer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


LeaderState = tuple[str, int, str]
"""``(key, create_revision, value)`` of an election's leader."""


def leader_changes(
    changes: Iterable[Change], election: str
) -> list[tuple[int, LeaderState | None]]:
    """The ground-truth leader of ``election`` after each change of its contender keys:
    ``(revision, (key, create_revision, value) or None)``, listed only where the leader
    changed (another key, a new incarnation, a new proclaimed value, or nobody) — the
    same notion of "change" as :meth:`etcdfence.Client.observe`. The first entry is
    the state after the first observed change."""
    prefix = election + "/"
    live: dict[str, Change] = {}
    out: list[tuple[int, LeaderState | None]] = []
    ordered = sorted((c for c in changes if c.key.startswith(prefix)), key=lambda c: c.revision)
    for change in ordered:
        if change.deleted:
            live.pop(change.key, None)
        else:
            live[change.key] = change
        first = min(live.values(), key=lambda c: c.create_revision, default=None)
        state = None if first is None else (first.key, first.create_revision, first.value)
        if not out or state != out[-1][1]:
            out.append((change.revision, state))
    return out
