"""The worker side: tasks that run their effect through a fence with the beat's token.

A task sent by :class:`~etcdfence.celery.LeaderScheduler` carries the term's token in
the ``fencing-token`` header and its slot in ``etcdfence-slot``. A :class:`FencedTask`
(or a function decorated with :func:`fenced_task`) reads both, and

- refuses the task when the token is missing, malformed, of another election (or a
  bare number), or below the fence's mark: logged (``etcdfence.task_refused``),
  counted, not retried, its effect never run;
- hands the task a :class:`Fenced`: the token, the fence and the slot.
  ``fenced.apply(ops)`` writes the effect in one fenced transaction together with a
  ``Create`` of the slot's key, so a second delivery of the slot (the old leader's
  message and the new leader's resend, or a redelivery after a worker crash) applies
  nothing: logged as ``etcdfence.task_duplicate``, counted, not an error.

A worker whose app has fenced tasks checks the ``etcdfence_*`` settings when it starts
(Celery's ``worker_init`` signal): bad settings stop it with a clear error, instead of a
worker that starts and then fails every task.

A refused or duplicate task ends with Celery's :class:`~celery.exceptions.Ignore` (here
:class:`TaskRefused`, a subclass): the message is acknowledged, no result is stored, no
retry happens — also with ``autoretry_for`` (Celery re-raises ``Ignore``).
"""

from __future__ import annotations

import collections
import functools
import json
import os
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from celery import Task, shared_task
from celery.exceptions import Ignore
from celery.signals import worker_init

from .. import metrics
from ..errors import InvalidTokenError, KeyExistsError, OutcomeUnknownError, StaleTokenError
from ..fence.ops import Create, Op, Put
from ..token import METADATA_KEY, FencingToken
from ._config import CeleryConfigError, Settings

__all__ = [
    "REASONS",
    "SLOT_HEADER",
    "TOKEN_HEADER",
    "Fenced",
    "FencedTask",
    "TaskRefused",
    "fenced_task",
    "refusals",
]

#: The header holding the term's token (``FencingToken.to_metadata()``'s key).
TOKEN_HEADER = METADATA_KEY
#: The header holding the slot id, ``<entry>@<UTC scheduled time>``.
SLOT_HEADER = "etcdfence-slot"
#: Why a task was refused: ``stale`` (token below the mark), ``no_token``, ``invalid``
#: (malformed header, or a token the fence refuses as foreign or from the future),
#: ``foreign`` (a token of another election, or a bare number), ``duplicate`` (the
#: slot's effect was applied already).
REASONS = ("stale", "no_token", "invalid", "foreign", "duplicate")

#: Refusals in this process by reason (``refusals["stale"]``): always kept, whether or not
#: Prometheus metrics are on (then also ``etcdfence_tasks_refused_total{task,reason}``).
refusals: collections.Counter[str] = collections.Counter()

_F = TypeVar("_F", bound=Callable[..., Any])


class TaskRefused(Ignore):  # type: ignore[misc]
    """A fenced task was refused (``reason`` in :data:`REASONS`); Celery treats it as
    ``Ignore``: acknowledged, not retried, no result stored."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _refuse(task: str, reason: str, detail: str, **fields: Any) -> TaskRefused:
    """Log and count a refusal; return the exception that ends the task."""
    refusals[reason] += 1
    metrics.task_refused(task, reason, detail, **fields)
    return TaskRefused(reason, detail)


@dataclass
class Fenced:
    """What a fenced task runs its effect through: the term's ``token``, the ``fence``
    (any backend: :class:`~etcdfence.FenceGuard`, ``SQLFence``, ``RedisFence``) and
    the ``slot`` it was sent for (``None`` for a task sent by hand with a token).

    Put the whole effect in one :meth:`apply`: that transaction also creates the slot's
    key, which is what makes the slot's effect happen once. The slot counts as used only
    once a transaction carrying its ``Create`` was definitely applied; later applies of
    the same call are then fenced by the token only.

    **Trying an apply again.** An apply that raised :class:`~etcdfence.UnavailableError`
    (nothing was applied) can simply be called again. One that raised its subclass
    :class:`~etcdfence.OutcomeUnknownError` (the answer was lost: the write may have
    applied) may be called again *with the same ops*: the next apply first fences the
    lost attempt off (``fence.fence_off(token)``, unless the error says it is already),
    then sends the slot's ``Create`` again with this delivery's own value. If the key
    exists with that value, the lost attempt had applied, with every op of it: the apply
    returns 0 (this call wrote nothing; the version of the earlier write is unknown).
    If another delivery's value is there, the task ends as a ``duplicate``."""

    token: FencingToken
    fence: Any
    slot: str | None
    slot_key: str | None
    task: str
    fencing: bool = True
    #: ``pending`` (the slot's Create not applied yet), ``unknown`` (a transaction
    #: carrying it lost its answer), ``used`` (definitely applied).
    _slot_state: str = field(default="pending", repr=False)
    _fenced_off: bool = field(default=True, repr=False)
    _value: str = field(default="", repr=False)

    def apply(self, ops: Sequence[Op]) -> int:
        """Write ``ops`` in one fenced transaction with the token (and the slot's
        ``Create`` until one carrying it applied); returns the backend's
        revision/version, or 0 when this call found that its lost earlier attempt had
        applied (see the class docstring). A stale token or an already-applied slot ends
        the task (:class:`TaskRefused`)."""
        ops = list(ops)
        if not self.fencing:  # the control: no token check, no slot key (tests only)
            return self._apply_unfenced(ops)
        create = self.slot_key is not None and self._slot_state != "used"
        if create:
            self._fence_off_lost()
            ops = [Create(str(self.slot_key), self._delivery()), *ops]
        try:
            version = int(self.fence.txn(self.token, ops))
        except StaleTokenError as err:
            raise self._stale(err) from None
        except OutcomeUnknownError as err:
            if create:  # did the slot's Create apply? decided by the next apply
                self._slot_state, self._fenced_off = "unknown", err.fenced_off
            raise
        except KeyExistsError as err:
            if create and self._slot_state == "unknown" and _text(err.value) == self._delivery():
                self._slot_state = "used"  # our own lost attempt applied, all its ops
                metrics.log.info("etcdfence.task_lost_apply_found", task=self.task, slot=self.slot)
                return 0
            raise _refused_duplicate(self.task, self.slot, self.token) from None
        if create:
            self._slot_state = "used"
        return version

    def _fence_off_lost(self) -> None:
        """After a lost answer: make sure the lost attempt can no longer apply, so that
        the next attempt's outcome tells whether it had."""
        if self._fenced_off:
            return
        try:
            self.fence.fence_off(self.token)
        except StaleTokenError as err:
            raise self._stale(err) from None
        self._fenced_off = True

    def _stale(self, err: StaleTokenError) -> TaskRefused:
        return _refuse(self.task, "stale", str(err), token=self.token.value, slot=self.slot)

    def _delivery(self) -> str:
        """The slot key's value: this delivery's own, the same for each of its applies
        (KeyExistsError.value then tells another delivery's key from this one's)."""
        if not self._value:
            self._value = json.dumps(
                {"token": self.token.value, "task": self.task, "delivery": uuid.uuid4().hex}
            )
        return self._value

    def put(self, key: str | bytes, value: str | bytes) -> int:
        """``apply([Put(key, value)])``."""
        return self.apply([Put(key, value)])

    def _apply_unfenced(self, ops: list[Op]) -> int:
        """``etcdfence_fencing = False``: write at whatever the mark is now, as a worker
        without fencing would (retrying when the mark moves in between)."""
        for _ in range(20):
            mark = int(self.fence.current())
            try:
                return int(self.fence.txn(FencingToken(max(mark, self.token.value)), ops))
            except StaleTokenError:
                continue
        raise RuntimeError("the unfenced control could not write: the mark kept moving")


def _refused_duplicate(task: str, slot: str | None, token: FencingToken) -> TaskRefused:
    refusals["duplicate"] += 1
    metrics.task_duplicate(task, slot or "", token.value)
    return TaskRefused("duplicate", f"slot {slot!r} was applied already")


# -- the fence a worker process uses --------------------------------------------------

_fences: dict[tuple[int, int], Any] = {}
_fences_lock = threading.Lock()


def _text(value: str | bytes | None) -> str | None:
    """A :class:`KeyExistsError` value as text (a fence returns it in the Create's type:
    ``str`` from the etcd fence here, ``bytes`` from a store that keeps only bytes)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _default_fence(app: Any, settings: Settings) -> Any:
    from .._sync.client import Client

    client = Client(settings.endpoints, timeout=settings.timeout)
    # (the unsafe control writes bare numbers at the current mark: an unbound fence)
    lock = settings.election if settings.fencing else None
    return client.fence(settings.resource, lock=lock)


def fence_for(app: Any) -> Any:
    """This process's fence for ``app``: ``etcdfence_fence_factory(app)``, or an etcd
    fence on ``etcdfence_resource`` bound to ``etcdfence_election``. Made on first use in
    each process (after a prefork worker forked: no etcd connection crosses a fork)."""
    key = (os.getpid(), id(app))
    fence = _fences.get(key)
    if fence is None:
        with _fences_lock:
            fence = _fences.get(key)
            if fence is None:
                settings = Settings.from_app(app)
                factory = settings.fence_factory
                fence = factory(app) if factory is not None else _default_fence(app, settings)
                _fences[key] = fence
    return fence


def _check_worker_settings(sender: Any = None, **_: Any) -> None:
    """``worker_init``: a worker whose app has fenced tasks refuses to start with bad
    ``etcdfence_*`` settings (``SystemExit`` with the error: a Celery signal swallows
    any ``Exception`` of its receivers)."""
    app = getattr(sender, "app", None)
    if app is None or not any(isinstance(t, FencedTask) for t in app.tasks.values()):
        return
    try:
        Settings.from_app(app)
    except CeleryConfigError as err:
        metrics.log.error("etcdfence.celery_worker_refused", error=str(err))
        raise SystemExit(f"etcdfence.celery: the worker does not start: {err}") from None


worker_init.connect(_check_worker_settings, weak=False)


# -- the task class -------------------------------------------------------------------


def _header(request: Any, name: str) -> Any:
    headers = getattr(request, "headers", None) or {}
    value = headers.get(name) if isinstance(headers, dict) else None
    return value if value is not None else request.get(name)


class FencedTask(Task):  # type: ignore[misc]
    """A Celery task base class that refuses stale, tokenless and foreign tasks and gives
    the task its :class:`Fenced` (``self.fenced`` in a ``bind=True`` task).

    Use it as ``@app.task(base=FencedTask, bind=True)`` and write the effect with
    ``self.fenced.apply([...])``, or use :func:`fenced_task`, which passes the
    :class:`Fenced` as the first argument.
    """

    abstract = True

    @property
    def fenced(self) -> Fenced:
        """The running call's :class:`Fenced` (only inside the task)."""
        fenced = getattr(self.request, "etcdfence", None)
        if not isinstance(fenced, Fenced):
            raise RuntimeError("self.fenced is only available while a FencedTask runs")
        return fenced

    def on_refused(self, refused: TaskRefused) -> None:
        """Called once for every refused or duplicate call (``refused.reason``), after it
        was logged and counted; override it to record refusals somewhere durable. What
        it raises is logged and the task still ends as refused."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._call_fenced(*args, **kwargs)
        except TaskRefused as refused:
            try:
                self.on_refused(refused)
            except Exception:
                metrics.log.exception("etcdfence.on_refused_failed", task=self.name)
            raise

    def _call_fenced(self, *args: Any, **kwargs: Any) -> Any:
        fenced = self._admit()
        self.request.etcdfence = fenced
        try:
            return super().__call__(*args, **kwargs)
        except StaleTokenError as err:  # the task wrote through the fence itself
            raise _refuse(self.name, "stale", str(err), token=fenced.token.value) from None
        except KeyExistsError:
            raise _refused_duplicate(self.name, fenced.slot, fenced.token) from None
        except InvalidTokenError as err:
            raise _refuse(self.name, "invalid", str(err), token=fenced.token.value) from None

    def _admit(self) -> Fenced:
        """The call's :class:`Fenced`, or :class:`TaskRefused` (logged and counted)."""
        settings = Settings.from_app(self.app)
        raw = _header(self.request, TOKEN_HEADER)
        slot = _header(self.request, SLOT_HEADER)
        if slot is not None and (not isinstance(slot, str) or not slot):
            raise _refuse(self.name, "invalid", f"malformed {SLOT_HEADER} header {slot!r}")
        fence = fence_for(self.app)
        slot_key = None if slot is None else settings.slot_key(slot)
        if not settings.fencing:
            token = FencingToken.from_text(raw) if raw is not None else FencingToken(1)
            return Fenced(token, fence, slot, slot_key, self.name, fencing=False)
        if raw is None:
            raise _refuse(self.name, "no_token", f"no {TOKEN_HEADER} header", slot=slot)
        try:
            token = FencingToken.from_text(raw, source=f"{TOKEN_HEADER} header")
        except InvalidTokenError as err:
            raise _refuse(self.name, "invalid", str(err), slot=slot) from None
        if token.lock != settings.election:
            got = "a bare number" if token.lock is None else f"election {token.lock!r}"
            raise _refuse(
                self.name,
                "foreign",
                f"token {token.value} is {got}, not of election {settings.election!r}",
                slot=slot,
            )
        mark = int(fence.current())
        if token.value < mark:  # refused before the task runs any of its code
            raise _refuse(
                self.name,
                "stale",
                f"token {token.value} is below the mark {mark} of {settings.resource!r}",
                token=token.value,
                current=mark,
                slot=slot,
            )
        return Fenced(token, fence, slot, slot_key, self.name)


def fenced_task(app: Any = None, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Decorate ``fn(fenced, *args, **kwargs)`` into a :class:`FencedTask` of ``app``
    (``None``: a shared task); ``fenced`` is the call's :class:`Fenced`. ``options`` are
    ``app.task``'s (``name=``, ``queue=``, ``base=`` a :class:`FencedTask` subclass,
    ...). Use it for the periodic tasks a :class:`~etcdfence.celery.LeaderScheduler`
    sends::

        @fenced_task(app)
        def nightly_report(fenced, day):
            fenced.put(f"reports/{day}", build(day))
    """

    base = options.pop("base", FencedTask)
    if not (isinstance(base, type) and issubclass(base, FencedTask)):
        raise TypeError(f"fenced_task(base=...) must be a FencedTask subclass, got {base!r}")

    def decorate(fn: Callable[..., Any]) -> Any:
        @functools.wraps(fn)
        def run(self: FencedTask, *args: Any, **kwargs: Any) -> Any:
            return fn(self.fenced, *args, **kwargs)

        make = shared_task if app is None else app.task
        return make(base=base, bind=True, **options)(run)

    return decorate
