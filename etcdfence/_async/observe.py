"""Follow who leads an election, change by change."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterable
from typing import Any

from .. import metrics
from .._keys import contender_prefix, prefix_range_end
from .._log import log
from .._txn import range_request
from ..errors import CompactedError
from ..types import KeyValue, Leader, WatchEvent
from . import _compat
from .connection import AsyncConnection
from .watch import AsyncWatch


def _leader_of(name: str, contenders: dict[bytes, Any], revision: int) -> Leader | None:
    if not contenders:
        return None
    first = min(contenders.values(), key=lambda kv: kv.create_revision)
    return Leader(
        name=name,
        key=first.key.decode("utf-8", "replace"),
        value=first.value,
        create_revision=first.create_revision,
        lease_id=first.lease_id,
        revision=revision,
    )


def _revision_of(event: WatchEvent) -> int:
    return event.kv.mod_revision


def _apply(contenders: dict[bytes, Any], events: Iterable[WatchEvent]) -> None:
    for event in events:
        if event.type == "delete":
            contenders.pop(event.kv.key, None)
        else:
            contenders[event.kv.key] = event.kv


def _changed(old: Leader | None, new: Leader | None) -> bool:
    if old is None or new is None:
        return old is not new
    return (old.key, old.create_revision, old.value) != (new.key, new.create_revision, new.value)


async def observe_leader(
    conn: AsyncConnection, name: str, stop: _compat.Event | None = None
) -> AsyncIterator[Leader | None]:
    """Yield the current leader, then every change: a new leader, a new value, or
    ``None`` when nobody leads.

    Keeps the full contender set of ``name/`` from one range plus one prefix
    watch. If the watch falls behind a compaction, the set is re-read and
    observation continues — a change can be coalesced, but never missed silently
    and the iterator never ends by itself.
    """
    prefix = contender_prefix(name).encode("utf-8")
    last: Leader | None = None
    first = True
    while stop is None or not stop.is_set():
        response = await conn.call("Range", range_request(prefix, prefix=True), idempotent=True)
        contenders = {kv.key: KeyValue.from_wire(kv) for kv in response.kvs}
        current = _leader_of(name, contenders, response.header.revision)
        if first or _changed(last, current):
            first = False
            last = current
            metrics.leader_changed(name, None if current is None else current.key)
            yield current
        watch = AsyncWatch(
            conn,
            prefix,
            range_end=prefix_range_end(prefix),
            start_revision=response.header.revision + 1,
        )
        await watch.start()
        try:
            while True:
                try:  # with a stop event, wake twice a second to notice it
                    batch = await watch.get(None if stop is None else 0.5)
                except TimeoutError:
                    if stop is not None and stop.is_set():
                        return
                    continue
                except StopAsyncIteration:
                    break
                # one batch can span several revisions (a watch catching up): report the
                # leader after each of them, so no change is coalesced away
                for revision, events in itertools.groupby(batch.events, _revision_of):
                    _apply(contenders, events)
                    current = _leader_of(name, contenders, revision)
                    if _changed(last, current):
                        last = current
                        metrics.leader_changed(name, None if current is None else current.key)
                        yield current
        except CompactedError as err:
            log.info("etcdfence.observe_resync", election=name, error=str(err))
        finally:
            await watch.aclose()
