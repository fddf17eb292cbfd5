"""Leader-only APScheduler 3.x: jobs run only while this process leads an etcd election.

Use it when several replicas of a service define the same APScheduler jobs and each job
must run on one replica at a time — and a replica that was paused (GC, SIGSTOP, a VM
freeze) or cut off from etcd must not keep writing once another has taken over. Install
``etcdfence[apscheduler]`` (APScheduler ``>=3.10,<4``)::

    from apscheduler.schedulers.background import BackgroundScheduler
    from etcdfence.apscheduler import LeaderScheduler

    leader = LeaderScheduler(client, "jobs/scheduler", scheduler=BackgroundScheduler(),
                             ttl=10, fence=client.fence("reports"))

    @leader.scheduled_job("interval", seconds=30)
    def report(token):                    # declares `token`: it is passed in
        guard.put(token, "reports/latest", build_report())

    leader.start()                        # campaigns in the background; returns at once

:class:`LeaderScheduler` wraps a ``BackgroundScheduler`` (jobs on threads) and a
:class:`~etcdfence.LeaderElector`; :class:`AsyncLeaderScheduler` wraps an
``AsyncIOScheduler`` and an :class:`~etcdfence.AsyncLeaderElector`. Both behave alike:

- **start**: the scheduler is started *paused* in every replica; the elector campaigns.
- **election**: first every ``fence`` is advanced to the term's token (so an older
  leader's late writes are refused from now on), then ``on_elected(token)`` runs, then
  the recorded slots are read (see below) and the scheduler is resumed. If any of it
  raises, no job runs: the term is given up and the elector campaigns again after
  ``retry_interval``. :class:`LeaderScheduler` never awaits: an async fence or an
  ``async def`` ``on_elected`` is refused when it is constructed, and one that still
  returns an awaitable (a coroutine is never dropped) gives up the term and ends the
  campaign with :class:`~etcdfence.errors.InvalidTypeError` (in ``.error``): that
  replica then stands aside for good, as it can never fence a term.
- **jobs** get the term's :class:`~etcdfence.FencingToken`: a job function that declares a
  parameter ``token`` receives it, one that declares ``stop`` receives the term's
  ``threading.Event`` (set when the term ends); :func:`current_token` and
  :func:`current_stop` answer the same anywhere inside a job run. The token is the one
  of the term the run started in, so a write the job makes after the term was lost
  carries a token the fence refuses (:class:`~etcdfence.StaleTokenError`).
- **loss** (the session's local deadline passed, the lease was revoked, the key deleted):
  the scheduler is paused at once and ``stop`` is set; a run that was submitted but has
  not started yet is skipped (``etcdfence.apscheduler_job_skipped``). Jobs on threads
  cannot be interrupted: they see ``stop`` if they look, and their writes bounce at the
  fence. ``async def`` jobs of :class:`AsyncLeaderScheduler` are cancelled. Then
  ``on_lost()`` runs (if it raises, the error is logged,
  ``etcdfence.apscheduler_on_lost_failed``) and the elector campaigns again; the paused
  scheduler keeps its jobs.
- **shutdown**: pause, wait for running jobs (``wait=True``; in
  :class:`AsyncLeaderScheduler` both ``async def`` jobs and plain functions running on
  executor threads), shut the scheduler down, resign — so a standby takes over at once,
  not a TTL later.

Misfires across a failover follow APScheduler's own rule, as after any pause: a paused
scheduler keeps each job's next run time, and when this replica is elected and resumes,
a job whose run time passed runs **once** (``coalesce=True``, APScheduler's default) if
that run time is within the job's ``misfire_grace_time`` of now (default 1 s); otherwise
the run is reported missed (``EVENT_JOB_MISSED``) and the job runs at its next time. Set
``misfire_grace_time`` above the TTL + a few seconds (the failover time) for jobs whose
run must not be lost to a failover.

**Slots are recorded when a run starts, so a failover neither repeats nor loses one.**
When a run *starts* on its thread (or task) and is admitted (the term still holds), and
before the job body runs, it records its scheduled time (its *slot*, noted when
APScheduler handed the run to the executor) under
``/etcdfence/apscheduler/<name>/last/<job id>`` through the etcd fence
``<name>/schedule`` with the term's token. If that put is refused (a later term advanced
the fence) the run does not start; runs of one job take and record their slots one at a
time, oldest first. Each new term first advances that fence (a former leader can record
nothing from then on), reads the recorded slots, and moves every job whose next run time
is at or before its recorded slot to the trigger's next time after it. So a handover
(``shutdown()`` resigns after its runs) never runs the slot the old leader ran, and a slot
the old leader submitted but never started (its pool was busy when the term ended) is
unrecorded, so the next leader runs it (within ``misfire_grace_time``). A crash (SIGKILL,
power loss) of a run whose slot is recorded counts that slot as run: the next leader does
not start it again, as for any run cut short mid-way (make such a job resumable). A crash
before the record leaves the slot to the next leader. Jobs are matched across replicas
by id: give each job the same ``id`` everywhere, or let :meth:`~LeaderScheduler.add_job` name it
``<module>:<qualname>`` (a module-level function added once; anything else — a partial,
lambda, bound method, nested function, or a function added again — needs an explicit
``id``, as its default name would depend on the order of adds; ``id=""`` is refused).
Cron and date triggers give every replica the same run times; an interval trigger counts
from the moment the job was added in that replica (give it a ``start_date`` to align them).
``jitter`` is refused (each replica would draw its own, so a recorded slot would not
match the next leader's time for it), and so is a non-positive interval.

Jobs live in memory job stores only: ``add_job`` refuses any other store (SQLAlchemy,
Redis, MongoDB, ...) with :class:`~etcdfence.errors.InvalidArgumentError`, because such a
store keeps a reference to the bare job function and would run it outside any term, with
no token and no admission check. Every replica defines its jobs in code at start-up, and
the recorded slots (above) carry what a persistent store would: when a job last ran.
Jobs run on the scheduler's ``ThreadPoolExecutor`` or ``AsyncIOExecutor`` only: a process
pool (or any other executor) would run the bare function, with no admission and no token.
Add jobs only through :meth:`~LeaderScheduler.add_job` / ``scheduled_job``: a scheduler
that already holds jobs is refused, and once started the wrapped scheduler's own
``add_job`` / ``scheduled_job`` / ``modify_job(func=...)`` raise
:class:`~etcdfence.errors.InvalidArgumentError` (a job slipped into a job store some other
way is removed as it is added, before it can run), and so do ``add_jobstore`` of anything
but an empty memory store and ``add_executor`` of anything but a thread pool or an
asyncio executor.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import datetime as dt
import inspect
import json
import os
import socket
import sys
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, NoReturn, TypeVar

try:
    from apscheduler.events import EVENT_JOB_ADDED, EVENT_JOB_MODIFIED
    from apscheduler.executors.asyncio import AsyncIOExecutor
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.job import Job
    from apscheduler.jobstores.memory import MemoryJobStore
    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.schedulers.base import BaseScheduler
    from apscheduler.triggers.interval import IntervalTrigger
    from apscheduler.util import check_callable_args, ref_to_obj
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without it
    raise ImportError(
        "etcdfence.apscheduler needs APScheduler 3.x; install it with "
        "`pip install 'etcdfence[apscheduler]'`"
    ) from exc

from ._async.client import AsyncClient
from ._async.elector import AsyncLeaderElector
from ._log import log
from ._sync.client import Client
from ._sync.elector import LeaderElector
from .errors import (
    EtcdfenceError,
    InvalidArgumentError,
    InvalidTypeError,
    NotLeaderError,
    StaleTokenError,
)
from .token import FencingToken

__all__ = [
    "SLOTS_PREFIX",
    "AsyncLeaderScheduler",
    "LeaderScheduler",
    "SchedulerStateError",
    "current_stop",
    "current_token",
]

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", Client, AsyncClient)
#: The parameters a job function may declare to be given its term's token / stop event.
INJECTED = ("token", "stop")
#: Where each job's last run slot is recorded: ``<SLOTS_PREFIX><name>/last/<job id>``.
SLOTS_PREFIX = "/etcdfence/apscheduler/"
_MARK = "__etcdfence_apscheduler__"  # set on every job wrapper this module makes
#: ``add_job`` keywords that are the job's own options; every other keyword is the trigger's.
_JOB_OPTIONS = frozenset(
    {"id", "name", "misfire_grace_time", "coalesce", "max_instances", "next_run_time"}
    | {"jobstore", "executor", "replace_existing"}
)


class SchedulerStateError(EtcdfenceError, RuntimeError):
    """A leader scheduler was used in the wrong state: started twice, shut down before it
    started, or given an APScheduler scheduler that was already started."""


class _TakeOfficeFailed(EtcdfenceError):
    """Internal: advancing a fence or ``on_elected`` failed; the elector campaigns again."""


class _Term:
    """One term as the jobs see it: its token, its stop event, its running async jobs."""

    def __init__(self, token: FencingToken) -> None:
        self.token = token
        self.stop = threading.Event()
        self.tasks: set[asyncio.Task[Any]] = set()
        #: The slots recorded in etcd when the term began (job id -> slot).
        self.recorded: dict[str, dt.datetime] = {}


class _Pending:
    """The run times APScheduler handed an executor for one submitted run (compared by
    identity, so a refused submission takes out its own entry)."""

    __slots__ = ("times",)

    def __init__(self, times: Sequence[dt.datetime]) -> None:
        self.times = list(times)


class _ThreadRuns:
    """Job runs on threads not finished yet, so an asyncio shutdown can wait for them
    without blocking its event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def __enter__(self) -> None:
        with self._lock:
            self._count += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._count -= 1
            waiters = self._waiters if self._count == 0 else []
            if waiters:
                self._waiters = []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that loop is closed: nobody waits any more
                pass

    async def idle(self) -> None:
        """Return once no run is on a thread."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._count == 0:
                return
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, future))
        await future


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_RUN: contextvars.ContextVar[_Term | None] = contextvars.ContextVar(
    "etcdfence_apscheduler_run", default=None
)


def current_token() -> FencingToken:
    """The token of the term the running job started in. Call it inside a job of a
    :class:`LeaderScheduler` / :class:`AsyncLeaderScheduler` (or code it calls) to pass
    it to a fence; outside a job run it raises :class:`~etcdfence.errors.NotLeaderError`."""
    term = _RUN.get()
    if term is None:
        raise NotLeaderError("current_token() is only known inside a job of a LeaderScheduler")
    return term.token


def current_stop() -> threading.Event:
    """The running job's stop event: set once the term the run started in has ended.
    Long jobs check it between steps (``if current_stop().is_set(): return``)."""
    term = _RUN.get()
    if term is None:
        raise NotLeaderError("current_stop() is only known inside a job of a LeaderScheduler")
    return term.stop


def _declared(func: Callable[..., Any]) -> tuple[str, ...]:
    """Which of :data:`INJECTED` the job function takes as a named parameter."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # a builtin without a signature: nothing to inject
        return ()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(n for n in INJECTED if n in params and params[n].kind in kinds)


def _is_async(func: Any) -> bool:
    """Whether calling ``func`` gives a coroutine: an ``async def`` function (or a
    partial of one), or an object whose ``__call__`` is ``async def``."""
    if inspect.iscoroutinefunction(func):
        return True
    call = inspect.getattr_static(type(func), "__call__", None)
    return not inspect.isroutine(func) and inspect.iscoroutinefunction(call)


def _refuse_awaitable(result: object, what: str) -> None:
    """The sync flavour got an awaitable: close it (no 'never awaited' warning) and
    refuse it, naming the flavour that awaits."""
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()
        raise InvalidTypeError(
            f"{what} returned an awaitable (an async function?); LeaderScheduler never "
            "awaits: use AsyncLeaderScheduler, or pass a plain function"
        )


def _identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _fences(fence: Any, sync: bool) -> tuple[Any, ...]:
    fences = () if fence is None else tuple(fence) if isinstance(fence, Sequence) else (fence,)
    legacy = sys.modules.get("etcdfence.fence.sql.legacy")  # only loaded if one was made
    for each in fences:
        if legacy is not None and isinstance(each, legacy.UnboundSQLFence):
            raise InvalidTypeError(
                "fence is a deprecated SQLFence(connection) with no resource; bind it: "
                "SQLFence(connection, resource)"
            )
        if not callable(getattr(each, "advance", None)):
            raise InvalidTypeError(
                f"fence must be a fence (with advance(token)), or a list of them; "
                f"got {type(each).__name__}"
            )
        if sync and _is_async(each.advance):
            raise InvalidTypeError(
                f"fence {type(each).__name__} is async (its advance() is a coroutine), "
                "and LeaderScheduler never awaits: use AsyncLeaderScheduler, or the "
                "fence's sync form"
            )
    return fences


def _check_scheduler(scheduler: Any, kind: type[Any], owner: str, other: str) -> None:
    name = f"{type(scheduler).__module__}.{type(scheduler).__qualname__}"
    if not isinstance(scheduler, BaseScheduler):
        raise InvalidTypeError(
            f"{owner} needs an APScheduler 3.x {kind.__name__} (pip install "
            f"'etcdfence[apscheduler]', APScheduler>=3.10,<4); got {name}"
        )
    if not isinstance(scheduler, kind):
        raise InvalidTypeError(f"{owner} takes a {kind.__name__}, got {name}; {other}")
    if scheduler.running:
        raise SchedulerStateError(
            f"{owner} starts the scheduler itself (paused until elected): pass it unstarted"
        )


def _check_hooks(owner: str, on_elected: Any, on_lost: Any, sync: bool) -> None:
    for what, hook in (("on_elected", on_elected), ("on_lost", on_lost)):
        if hook is None:
            continue
        if not callable(hook):
            raise InvalidTypeError(f"{what} must be callable, got {hook!r}")
        if sync and _is_async(hook):
            raise InvalidTypeError(
                f"{what} is an async function and {owner} never awaits: use "
                "AsyncLeaderScheduler, or pass a plain function"
            )


def _resolve_job(func: Callable[..., Any] | str) -> Callable[..., Any]:
    """The job function itself, a ``'module:name'`` reference resolved (clear errors)."""
    if isinstance(func, str):
        try:
            func = ref_to_obj(func)
        except (LookupError, ValueError) as err:
            raise InvalidArgumentError(
                f"func {func!r} does not name a callable ('package.module:name'): {err}"
            ) from None
    if not callable(func):
        raise InvalidTypeError(f"func must be callable or a 'module:name' reference: {func!r}")
    return func


def _check_trigger(trigger: Any) -> None:
    """Refuse a trigger whose run times are not the same in every replica (jitter) or
    that never advances (a non-positive interval)."""
    if getattr(trigger, "jitter", None):
        raise InvalidArgumentError(
            f"jitter={trigger.jitter!r} is refused: each replica draws its own jitter, so "
            "the run time a leader records is not the one the next leader computes for "
            "the same slot, and a handover could run that slot twice; leave jitter out"
        )
    if isinstance(trigger, IntervalTrigger) and trigger.interval_length <= 0:
        raise InvalidArgumentError(
            f"an interval trigger needs a positive period, got {trigger.interval!r}"
        )
    for each in getattr(trigger, "triggers", None) or ():  # AndTrigger / OrTrigger
        _check_trigger(each)


def _period(trigger_args: dict[str, Any]) -> dt.timedelta:
    """The period an ``"interval"`` trigger's keywords ask for (checked to be numbers
    by the trigger itself already)."""
    units = ("weeks", "days", "hours", "minutes", "seconds")
    return dt.timedelta(**{unit: trigger_args.get(unit, 0) for unit in units})


def _check_job_id(job_id: object, func: Callable[..., Any]) -> None:
    """An explicit id must be a non-empty str; without one, only a module-level
    function has a name that is the same in every replica whatever the order of adds."""
    if job_id is not None:
        if not isinstance(job_id, str) or not job_id:
            raise InvalidArgumentError(
                f"id must be a non-empty str (the same in every replica), got {job_id!r}"
            )
        return
    qualname = getattr(func, "__qualname__", None)
    if not inspect.isfunction(func) or qualname != func.__name__ or qualname == "<lambda>":
        raise InvalidArgumentError(
            f"give {func!r} an explicit id= (the same in every replica): only a "
            "module-level function is named by itself; the default name of a partial, "
            "lambda, bound method or nested function depends on the order jobs are "
            "added, and a replica that adds them in another order would swap their "
            "recorded slots (a handover could repeat or skip a run)"
        )


def _slot_text(at: dt.datetime) -> str:
    return at.astimezone(dt.timezone.utc).isoformat()


class _LeaderSchedulerBase(Generic[C]):
    """What both flavours share: arguments, the job wrapper, the term's bookkeeping.

    A flavour names its client, scheduler and elector classes and how to call the
    other flavour (for the errors)."""

    _client_type: type[Any]
    _scheduler_type: type[Any]
    _elector_type: type[Any]
    _other: str
    _sync: bool

    def __init__(
        self,
        client: C,
        name: str,
        *,
        scheduler: Any = None,
        identity: str | None = None,
        ttl: int = 10,
        fence: Any = None,
        on_elected: Callable[[FencingToken], Any] | None = None,
        on_lost: Callable[[], Any] | None = None,
        margin: float | None = None,
        retry_interval: float = 1.0,
    ) -> None:
        owner, wanted = type(self).__name__, self._client_type
        if not isinstance(client, wanted):
            raise InvalidTypeError(
                f"{owner} needs an etcdfence.{wanted.__name__}, got {type(client).__name__}; "
                f"{self._other}"
            )
        scheduler = self._scheduler_type() if scheduler is None else scheduler
        _check_scheduler(scheduler, self._scheduler_type, owner, self._other)
        _check_hooks(owner, on_elected, on_lost, self._sync)
        self._client: C = client
        self._scheduler = scheduler
        self._check_own_jobs()
        self._fences = _fences(fence, self._sync)
        self._on_elected = on_elected
        self._on_lost = on_lost
        self._term: _Term | None = None
        self._lock = threading.Lock()
        self._started = False
        self._closing = False
        self._threads = _ThreadRuns()
        self._default_ids: collections.Counter[str] = collections.Counter()
        self._aliases: set[str] = set()
        self._executor_aliases: set[str] = set()
        self._pending: collections.defaultdict[str, collections.deque[_Pending]] = (
            collections.defaultdict(collections.deque)
        )
        self._pending_lock = threading.Lock()
        self._elector = self._elector_type(
            client,
            name,
            identity=_identity() if identity is None else identity,
            ttl=ttl,
            on_lost=None if on_lost is None else self._lost,
            margin=margin,
            retry_interval=retry_interval,
        )
        election = self._elector.name
        self._slots = client.fence(f"{election}/schedule", lock=election)
        self._slots_prefix = f"{SLOTS_PREFIX}{election}/last/"
        #: What ended the elector's background run, if anything but shutdown() did.
        self.error: BaseException | None = None

    @property
    def scheduler(self) -> Any:
        """The wrapped APScheduler scheduler: use it for everything but ``add_job``,
        ``scheduled_job``, ``start`` and ``shutdown`` (``get_jobs``, ``remove_job``,
        ``add_listener``, ...). Do not pause or resume it yourself."""
        return self._scheduler

    @property
    def elector(self) -> Any:
        """The underlying :class:`~etcdfence.LeaderElector` (or async one): its
        ``session`` (deadline, lease), ``terms``, ``key_taken()``. Do not run or stop it."""
        return self._elector

    @property
    def token(self) -> FencingToken | None:
        """The current term's token; ``None`` while not leading (also as soon as the
        session's local deadline passed)."""
        token: FencingToken | None = self._elector.token
        return token

    def is_leader(self) -> bool:
        """Whether this replica leads now (and so runs jobs); no I/O."""
        return bool(self._elector.is_leader())

    def add_job(
        self,
        func: Callable[..., Any] | str,
        trigger: Any = None,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """``scheduler.add_job(...)`` with the same arguments (``id``, ``misfire_grace_time``,
        ``coalesce``, trigger arguments, ...), the job wrapped so it runs only within a
        term and gets the term's token (see the module docstring). Without ``id`` the
        job is named ``<module>:<qualname>`` (module-level functions, added once), the same
        in every replica, which is how its recorded slot is found. Only memory job
        stores are accepted. Returns APScheduler's ``Job``."""
        target = _resolve_job(func)
        self._check_job_kind(target)
        wants = _declared(target)
        supplied = dict(kwargs or {})
        clash = sorted(set(wants) & set(supplied))
        if clash:
            raise InvalidArgumentError(f"{', '.join(clash)} is passed in by the scheduler")
        try:  # APScheduler's own check, with the injected arguments counted as given
            check_callable_args(target, tuple(args or ()), {**supplied, **dict.fromkeys(wants)})
        except ValueError as err:
            raise InvalidArgumentError(str(err)) from None
        alias = options.get("jobstore", "default")
        self._check_jobstore(alias)
        self._check_executor(options.get("executor", "default"))
        built = self._trigger(trigger, options)
        _check_job_id(options.get("id"), target)
        if options.get("id") is None:
            options["id"] = self._default_id(target)
        job: Job = self._scheduler.add_job(
            self._wrap(target, wants, options["id"]), built, args, kwargs, **options
        )
        self._aliases.add(alias)
        self._executor_aliases.add(options.get("executor", "default"))
        return job

    def _trigger(self, trigger: Any, options: dict[str, Any]) -> Any:
        """Build the trigger from ``trigger`` and the trigger's keywords (taken out of
        ``options``) as APScheduler would, and check it."""
        trigger_args = {k: options.pop(k) for k in list(options) if k not in _JOB_OPTIONS}
        try:
            built = self._scheduler._create_trigger(trigger, trigger_args)
        except (TypeError, ValueError, LookupError) as err:
            raise InvalidArgumentError(f"bad trigger {trigger!r}: {err}") from None
        if trigger == "interval" and _period(trigger_args) <= dt.timedelta(0):
            # APScheduler quietly makes an all-zero period 1 s (and keeps a negative one)
            raise InvalidArgumentError(
                f"an interval trigger needs a positive period, got {trigger_args}"
            )
        _check_trigger(built)
        return built

    def scheduled_job(
        self,
        trigger: Any,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Callable[[F], F]:
        """The decorator form of :meth:`add_job` (as ``scheduler.scheduled_job``); the
        decorated function is returned unchanged."""

        def decorate(func: F) -> F:
            self.add_job(func, trigger, args, kwargs, **options)
            return func

        return decorate

    def _check_job_kind(self, func: Callable[..., Any]) -> None:
        """Refuse what this flavour's executor cannot run (overridden per flavour)."""

    def _default_id(self, func: Callable[..., Any]) -> str:
        module = getattr(func, "__module__", None) or type(func).__module__
        qualname = getattr(func, "__qualname__", None) or type(func).__qualname__
        base = f"{module}:{qualname}"
        if self._default_ids[base]:
            raise InvalidArgumentError(
                f"{base} was already added without an id: give each of its jobs an "
                "explicit id= (the same in every replica); a numbered default would "
                "depend on the order jobs are added, and replicas that add them in "
                "another order would swap their recorded slots"
            )
        self._default_ids[base] += 1
        return base

    def _check_executor(self, alias: object) -> None:
        """Only a thread pool or an asyncio executor runs the wrapped job in this
        process: a process pool pickles the job by reference and runs the bare function
        (no admission, no token). An alias the scheduler does not have is refused too."""
        executors = getattr(self._scheduler, "_executors", {})
        executor = executors.get(alias) if isinstance(alias, str) else None
        if executor is None:
            if alias == "default":  # APScheduler creates it at start: a thread/asyncio one
                return
            raise InvalidArgumentError(
                f"executor {alias!r} is not one of the scheduler's executors "
                f"{sorted(executors)}; add it to the scheduler before the job"
            )
        if not isinstance(executor, (ThreadPoolExecutor, AsyncIOExecutor)):
            raise InvalidArgumentError(
                f"executor {alias!r} is a {type(executor).__name__}: "
                f"{type(self).__name__} runs jobs on a ThreadPoolExecutor or an "
                "AsyncIOExecutor only (another executor, a process pool above all, would "
                "run the bare function: no admission check, no token)"
            )

    def _check_jobstore(self, alias: str) -> None:
        """A persistent job store would keep the bare function's reference and run it
        with no term: only memory stores are accepted; an unknown alias is refused."""
        stores = getattr(self._scheduler, "_jobstores", {})
        if alias not in stores and alias != "default":
            raise InvalidArgumentError(
                f"job store {alias!r} is not one of the scheduler's job stores "
                f"{sorted(stores)}; add it to the scheduler before the job"
            )
        store = stores.get(alias)
        if store is not None and not isinstance(store, MemoryJobStore):
            raise InvalidArgumentError(
                f"job store {alias!r} is a {type(store).__name__}: {type(self).__name__} "
                "keeps jobs in memory job stores only (a persistent store would run the "
                "bare function, outside any term, with no token); every replica adds "
                "its jobs at start-up and the last run of each is recorded in etcd"
            )

    def _check_own_jobs(self) -> None:
        """Every job of the scheduler must be one this class wrapped."""
        foreign = [j.id for j in self._scheduler.get_jobs() if not hasattr(j.func, _MARK)]
        if foreign:
            raise InvalidArgumentError(
                f"the scheduler holds jobs not added through {type(self).__name__}.add_job "
                f"(they would run outside any term, with no token): {sorted(foreign)}; "
                "add them with add_job / scheduled_job instead"
            )

    def _guard_scheduler(self) -> None:
        """From :meth:`start` on, refuse a job put on the wrapped scheduler directly
        (``leader.scheduler.add_job`` / ``scheduled_job``, or ``modify_job(func=...)``
        with a bare function): it would run outside any term, with no token. The
        scheduler's own ``add_job`` / ``modify_job`` raise
        :class:`~etcdfence.errors.InvalidArgumentError`; a job that reaches a job store
        some other way (``_real_add_job``, a store's ``add_job``) is removed as it is
        added, before it can run, and logged (``etcdfence.apscheduler_foreign_job``)."""
        scheduler = self._scheduler
        if scheduler.__dict__.get(_MARK):
            return
        owner = type(self).__name__
        add, modify = scheduler.add_job, scheduler.modify_job

        def refuse(what: str) -> InvalidArgumentError:
            return InvalidArgumentError(
                f"{what} on the scheduler a {owner} wraps would run outside any term, "
                f"with no token: add jobs with {owner}.add_job / scheduled_job"
            )

        def add_job(func: Any, *args: Any, **kwargs: Any) -> Job:
            if not getattr(func, _MARK, False):
                raise refuse(f"scheduler.add_job({getattr(func, '__qualname__', func)!r})")
            return add(func, *args, **kwargs)

        def modify_job(job_id: str, jobstore: str | None = None, **changes: Any) -> Job:
            if "func" in changes and not getattr(changes["func"], _MARK, False):
                raise refuse(f"scheduler.modify_job({job_id!r}, func=...)")
            return modify(job_id, jobstore, **changes)

        scheduler.add_job, scheduler.modify_job = add_job, modify_job
        self._guard_stores_and_executors(refuse)
        scheduler.add_listener(self._drop_foreign, EVENT_JOB_ADDED | EVENT_JOB_MODIFIED)
        scheduler.__dict__[_MARK] = True

    def _guard_stores_and_executors(self, refuse: Callable[[str], Exception]) -> None:
        """From :meth:`start` on, a job store or executor added to the wrapped scheduler
        must pass the same checks as at start: a job store must be an empty memory store
        (one that already holds jobs, a persistent one from an earlier deploy above all,
        would run their bare functions with no term), an executor a thread pool or an
        asyncio one (a process pool runs the bare function). APScheduler's own start adds
        its defaults through these too: they pass."""
        scheduler = self._scheduler
        add_store, add_executor = scheduler.add_jobstore, scheduler.add_executor

        def add_jobstore(jobstore: Any, alias: str = "default", **options: Any) -> None:
            if not isinstance(jobstore, MemoryJobStore) or jobstore.get_all_jobs():
                raise refuse(f"scheduler.add_jobstore({type(jobstore).__name__}, {alias!r})")
            add_store(jobstore, alias, **options)

        def add_executor_(executor: Any, alias: str = "default", **options: Any) -> None:
            if not isinstance(executor, (ThreadPoolExecutor, AsyncIOExecutor)):
                raise refuse(f"scheduler.add_executor({type(executor).__name__}, {alias!r})")
            add_executor(executor, alias, **options)
            if getattr(scheduler, "running", False):
                self._watch_executors()  # its runs record their slots like the others'

        scheduler.add_jobstore, scheduler.add_executor = add_jobstore, add_executor_

    def _drop_foreign(self, event: Any) -> None:
        """The job-added/modified listener: remove a job whose function this class did
        not wrap (it runs synchronously in the adding call, before the job can run)."""
        job = self._scheduler.get_job(event.job_id, event.jobstore)
        if job is None or getattr(job.func, _MARK, False):
            return
        self._scheduler.remove_job(event.job_id, event.jobstore)
        log.error(
            "etcdfence.apscheduler_foreign_job",
            job=event.job_id,
            election=self._elector.name,
            reason="added to the wrapped scheduler directly: removed (no term, no token)",
        )

    def _check_before_start(self) -> None:
        self._check_own_jobs()
        for alias in sorted(self._aliases):
            self._check_jobstore(alias)
        for alias in sorted(self._executor_aliases):
            self._check_executor(alias)

    def _watch_executors(self) -> None:
        """Once the scheduler has started (its default executor exists): note the run
        times APScheduler hands each executor, per job id in order, so the run can
        record its own slot when it starts (:meth:`_take_times`)."""
        for executor in getattr(self._scheduler, "_executors", {}).values():
            if getattr(executor, _MARK, False):
                continue
            executor.submit_job = self._noting(executor.submit_job)
            setattr(executor, _MARK, True)

    def _noting(self, submit: Callable[[Job, Any], None]) -> Callable[[Job, Any], None]:
        """``executor.submit_job`` that first notes the run times for the job id."""

        def submit_job(job: Job, run_times: Any) -> None:
            entry = _Pending(run_times)
            with self._pending_lock:
                self._pending[job.id].append(entry)
            try:
                submit(job, run_times)
            except BaseException:  # not submitted (max instances): not run either
                with self._pending_lock:
                    if entry in self._pending[job.id]:
                        self._pending[job.id].remove(entry)
                raise

        return submit_job

    def _take_times(self, job_id: str) -> list[dt.datetime]:
        """The run times of the oldest submitted run of ``job_id`` not started yet
        (runs of one job are indistinguishable but for their slot: the first to start
        takes the oldest)."""
        with self._pending_lock:
            queue = self._pending.get(job_id)
            return queue.popleft().times if queue else []

    def _admit(self, name: str) -> _Term | None:
        """The term a run starts in, or ``None`` (skip it) when none is running now: a
        term is running while the elector leads (false as soon as a loss is known) with
        the term's token."""
        term = self._term
        if (
            term is None
            or term.stop.is_set()
            or not self._elector.is_leader()
            or self._elector.token != term.token
        ):
            log.warning("etcdfence.apscheduler_job_skipped", job=name, reason="not leading")
            return None
        return term

    def _wrap(
        self, func: Callable[..., Any], wants: tuple[str, ...], job_id: str
    ) -> Callable[..., Any]:
        name = getattr(func, "__qualname__", repr(func))
        wrapped = (
            self._wrap_async(func, wants, job_id, name)
            if _is_async(func)
            else self._wrap_sync(func, wants, job_id, name)
        )
        # APScheduler names the job after these; no __wrapped__, so its argument check
        # (done above, with the injected names) does not ask the caller for `token`
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            if hasattr(func, attr):
                setattr(wrapped, attr, getattr(func, attr))
        setattr(wrapped, _MARK, True)
        return wrapped

    def _wrap_async(
        self, func: Callable[..., Any], wants: tuple[str, ...], job_id: str, name: str
    ) -> Callable[..., Any]:
        """An ``async def`` job: admitted, its slot recorded, then run as a task of the
        term (cancelled when the term ends)."""

        order = asyncio.Lock()  # runs of this job take and record their slots in turn

        async def job(*args: Any, **kwargs: Any) -> Any:
            task = asyncio.current_task()
            term: _Term | None = None
            reset: contextvars.Token[_Term | None] | None = None
            try:
                async with order:
                    times = self._take_times(job_id)
                    term = self._admit(name)
                    if term is None:
                        return None
                    if task is not None:
                        term.tasks.add(task)
                    if not await self._record_on_loop(term, job_id, times):
                        return None
                reset = _RUN.set(term)
                kwargs.update({n: getattr(term, n) for n in wants})
                return await func(*args, **kwargs)
            except asyncio.CancelledError:
                if term is None or not term.stop.is_set():  # not ours: let it through
                    raise
                # the term's end cancelled it: an expected end, not a job error
                log.info("etcdfence.apscheduler_job_cancelled", job=name)
                return None
            finally:
                if reset is not None:
                    _RUN.reset(reset)
                if term is not None and task is not None:
                    term.tasks.discard(task)

        return job

    def _wrap_sync(
        self, func: Callable[..., Any], wants: tuple[str, ...], job_id: str, name: str
    ) -> Callable[..., Any]:
        """A plain job, on an executor thread: admitted, its slot recorded, then run."""

        order = threading.Lock()  # runs of this job take and record their slots in turn

        def sync_job(*args: Any, **kwargs: Any) -> Any:
            with self._threads:
                with order:
                    times = self._take_times(job_id)
                    term = self._admit(name)
                    if term is None or not self._record_from_thread(term, job_id, times):
                        return None
                reset = _RUN.set(term)
                try:
                    kwargs.update({n: getattr(term, n) for n in wants})
                    result = func(*args, **kwargs)
                finally:
                    _RUN.reset(reset)
                _refuse_awaitable(result, f"job {name}")
                return result

        return sync_job

    # -- slots ------------------------------------------------------------------------

    def _already_run(self, term: _Term, job_id: str, times: list[dt.datetime]) -> bool:
        """Whether this run's slot was recorded before ``term`` began (a run submitted
        in an earlier term of this replica that another leader ran meanwhile)."""
        recorded = term.recorded.get(job_id)
        if not times or recorded is None or max(times) > recorded:
            return False
        log.info(
            "etcdfence.apscheduler_slot_skipped",
            job=job_id,
            slot=_slot_text(max(times)),
            recorded=_slot_text(recorded),
        )
        return True

    def _slot_entry(self, term: _Term, job_id: str, times: list[dt.datetime]) -> tuple[str, str]:
        key = self._slots_prefix + urllib.parse.quote(job_id, safe="")
        value = json.dumps({"slot": _slot_text(max(times)), "token": term.token.value})
        return key, value

    def _record_failed(self, term: _Term, key: str, err: EtcdfenceError) -> bool:
        """After the slot's put failed: whether the run still goes ahead. A refused put
        (a later term advanced the fence) means this term is over: the run does not
        start and the next leader, finding the slot unrecorded, runs it. Any other
        failure (the put may or may not have landed): it runs if the term still holds
        (at least once)."""
        event = "fenced_off" if isinstance(err, StaleTokenError) else "failed"
        log.warning(f"etcdfence.apscheduler_slot_record_{event}", key=key, error=str(err))
        if isinstance(err, StaleTokenError):
            return False
        return not term.stop.is_set() and self._elector.token == term.token

    def _record_from_thread(self, term: _Term, job_id: str, times: list[dt.datetime]) -> bool:
        """Record an admitted run's slot before its body starts, from the run's own
        thread; ``False``: the run must not start (already run, or the put refused)."""
        if self._already_run(term, job_id, times):
            return False
        if not times:
            return True
        key, value = self._slot_entry(term, job_id, times)
        try:
            self._put_from_thread(term.token, key, value)
        except EtcdfenceError as err:
            return self._record_failed(term, key, err)
        return True

    async def _record_on_loop(self, term: _Term, job_id: str, times: list[dt.datetime]) -> bool:
        """:meth:`_record_from_thread` for an ``async def`` job, on the event loop."""
        if self._already_run(term, job_id, times):
            return False
        if not times:
            return True
        key, value = self._slot_entry(term, job_id, times)
        slots: Any = self._slots
        try:
            await slots.put(term.token, key, value)
        except EtcdfenceError as err:
            return self._record_failed(term, key, err)
        return True

    def _put_from_thread(self, token: FencingToken, key: str, value: str) -> None:
        """Put ``key`` through the schedule fence with ``token`` (per flavour)."""
        raise NotImplementedError

    def _recorded(self, kvs: Sequence[Any]) -> dict[str, dt.datetime]:
        """The recorded slot of each job id, from the keys under the slots prefix."""
        slots: dict[str, dt.datetime] = {}
        for kv in kvs:
            job_id = urllib.parse.unquote(kv.key[len(self._slots_prefix) :])
            try:
                slots[job_id] = dt.datetime.fromisoformat(json.loads(kv.value)["slot"])
            except (ValueError, KeyError, TypeError) as err:
                log.warning("etcdfence.apscheduler_bad_slot", key=kv.key, error=str(err))
        return slots

    def _skip_recorded(self, slots: dict[str, dt.datetime]) -> None:
        """Move every job whose next run is at or before its recorded slot (a slot a
        former leader ran) to its trigger's next time after that slot."""
        now = dt.datetime.now(dt.timezone.utc)
        for job in self._scheduler.get_jobs():
            recorded, due = slots.get(job.id), job.next_run_time
            if recorded is None or due is None or due > recorded:
                continue
            following = job.trigger.get_next_fire_time(recorded, now)
            log.info(
                "etcdfence.apscheduler_slot_skipped",
                job=job.id,
                slot=_slot_text(due),
                recorded=_slot_text(recorded),
            )
            if following is None:
                self._scheduler.remove_job(job.id)
            else:
                self._scheduler.modify_job(job.id, next_run_time=following)

    def _lost(self) -> Any:
        """The elector's ``on_lost``: the user's, its failure logged (per flavour)."""

    # -- terms ------------------------------------------------------------------------

    def _begin_term(self, term: _Term) -> bool:
        """Resume the scheduler for ``term`` unless shutting down; ``False``: do not lead."""
        with self._lock:
            if self._closing:
                return False
            self._term = term
            self._scheduler.resume()
        log.info(
            "etcdfence.apscheduler_resumed", election=self._elector.name, token=term.token.value
        )
        return True

    def _end_term(self, term: _Term) -> None:
        """The term is over: no new run starts (pause), running runs see ``stop``."""
        with self._lock:
            term.stop.set()
            if self._term is term:
                self._term = None
            if self._scheduler.running:
                self._scheduler.pause()
        for task in list(term.tasks):
            task.cancel()
        log.info(
            "etcdfence.apscheduler_paused", election=self._elector.name, token=term.token.value
        )

    def _claim_start(self) -> None:
        with self._lock:
            if self._started:
                raise SchedulerStateError(f"{type(self).__name__} already started")
            self._check_before_start()
            self._guard_scheduler()
            self._started = True

    def _claim_shutdown(self) -> bool:
        """Mark shutting down; ``False`` if it already is (a second shutdown is a no-op)."""
        with self._lock:
            if not self._started:
                raise SchedulerStateError(f"{type(self).__name__} was not started")
            if self._closing:
                return False
            self._closing = True
            if self._scheduler.running:
                self._scheduler.pause()
            return True

    def _on_lost_failed(self, err: BaseException) -> None:
        log.error(
            "etcdfence.apscheduler_on_lost_failed", election=self._elector.name, error=repr(err)
        )

    def _taking_office_failed(self, token: FencingToken, err: BaseException) -> NoReturn:
        log.warning(
            "etcdfence.apscheduler_take_office_failed",
            election=self._elector.name,
            token=token.value,
            error=repr(err),
        )
        if isinstance(err, InvalidTypeError):  # cannot ever work: end the campaign
            raise err
        raise _TakeOfficeFailed(f"could not take office with token {token.value}: {err!r}") from err


class LeaderScheduler(_LeaderSchedulerBase[Client]):
    """A ``BackgroundScheduler`` whose jobs run only while this process leads ``name``.

    Use it in every replica of a threaded service (Flask, Django, a worker) that runs
    APScheduler jobs which must run on one replica at a time. ``client`` is an
    :class:`etcdfence.Client`; ``scheduler`` an unstarted ``BackgroundScheduler`` with
    no jobs (default: a new one); ``identity`` this replica's value in the election
    (default ``<hostname>-<pid>``; a non-empty str); ``ttl`` the lease TTL in seconds (how
    long a frozen leader can keep others waiting); ``fence`` a fence or a list of fences
    (``client.fence``, :class:`~etcdfence.sql.SQLFence`,
    :class:`~etcdfence.redis.RedisFence` — sync ones: this class never awaits) advanced
    to the new term's token before any job runs; ``on_elected(token)`` another way to
    move marks the scheduler's fences cannot reach; ``on_lost()`` runs after a term ended
    (the scheduler is paused by then; if it raises, the error is logged and the replica
    campaigns on). See the module docstring for the rest.
    """

    _client_type = Client
    _scheduler_type = BackgroundScheduler
    _elector_type = LeaderElector
    _other = "use AsyncLeaderScheduler for an AsyncClient and an AsyncIOScheduler"
    _sync = True
    _thread: threading.Thread | None = None

    def _check_job_kind(self, func: Callable[..., Any]) -> None:
        if _is_async(func):
            raise InvalidTypeError(
                "a BackgroundScheduler runs jobs on threads and cannot run an async "
                "job (async def, or an object with an async __call__); use "
                "AsyncLeaderScheduler with an AsyncIOScheduler"
            )

    def start(self) -> None:
        """Check that etcd answers, start the scheduler paused and campaign in a
        background thread; returns at once. Raises
        :class:`~etcdfence.errors.UnavailableError` when etcd cannot be reached and
        :class:`SchedulerStateError` when called twice."""
        self._claim_start()
        try:
            self._client.revision()
            self._scheduler.start(paused=True)
            self._watch_executors()
        except BaseException:
            self._started = False
            raise
        self._thread = threading.Thread(
            target=self._run, name=f"etcdfence-apscheduler-{self._elector.name}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            self._elector.run(self._lead)
        except BaseException as err:  # the thread's end must not go unnoticed
            self.error = err
            log.exception("etcdfence.apscheduler_elector_failed", election=self._elector.name)
            with self._lock:
                if self._scheduler.running:
                    self._scheduler.pause()

    def _lead(self, token: FencingToken, stop: threading.Event) -> None:
        term = _Term(token)
        try:
            self._slots.advance(token)  # from now on no former leader records a slot
            for fence in self._fences:
                _refuse_awaitable(fence.advance(token), f"{type(fence).__name__}.advance")
            if self._on_elected is not None:
                _refuse_awaitable(self._on_elected(token), "on_elected")
            term.recorded = self._recorded(self._client.get_prefix(self._slots_prefix))
            self._skip_recorded(term.recorded)
        except Exception as err:
            self._taking_office_failed(token, err)
        if stop.is_set() or not self._begin_term(term):
            return
        try:
            stop.wait()
        finally:
            self._end_term(term)

    def _lost(self) -> None:
        assert self._on_lost is not None
        try:
            _refuse_awaitable(self._on_lost(), "on_lost")
        except Exception as err:  # a failing hook must not end the campaign
            self._on_lost_failed(err)

    def _put_from_thread(self, token: FencingToken, key: str, value: str) -> None:
        self._slots.put(token, key, value)

    def shutdown(self, wait: bool = True) -> None:
        """Stop scheduling, wait for running jobs (``wait=True``), shut the scheduler
        down and resign, so a standby takes over at once. A second call does nothing."""
        if not self._claim_shutdown():
            return
        if self._scheduler.running:
            self._scheduler.shutdown(wait=wait)
        self._elector.stop()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> LeaderScheduler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class AsyncLeaderScheduler(_LeaderSchedulerBase[AsyncClient]):
    """An ``AsyncIOScheduler`` whose jobs run only while this process leads ``name``.

    The asyncio twin of :class:`LeaderScheduler` (same arguments, an
    :class:`etcdfence.AsyncClient`); ``await start()`` / ``await shutdown()`` run on
    the event loop the scheduler should use. ``async def`` jobs are cancelled when the
    term ends; plain functions run on the loop's default executor threads and see
    ``stop``. ``on_elected`` / ``on_lost`` may be plain or ``async def`` functions, and
    a fence's ``advance`` may be a coroutine (``AsyncFenceGuard``, ``AsyncRedisFence``).
    """

    _client_type = AsyncClient
    _scheduler_type = AsyncIOScheduler
    _elector_type = AsyncLeaderElector
    _other = "use LeaderScheduler for a Client and a BackgroundScheduler"
    _sync = False
    _task: asyncio.Task[None] | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Check that etcd answers, start the scheduler paused on the running loop and
        campaign in a background task; returns at once. Raises
        :class:`~etcdfence.errors.UnavailableError` when etcd cannot be reached and
        :class:`SchedulerStateError` when called twice."""
        self._claim_start()
        self._loop = asyncio.get_running_loop()
        try:
            await self._client.revision()
            self._scheduler.start(paused=True)
            self._watch_executors()
        except BaseException:
            self._started = False
            raise
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"etcdfence-apscheduler-{self._elector.name}"
        )

    async def _run(self) -> None:
        try:
            await self._elector.run(self._lead)
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            self.error = err
            log.exception("etcdfence.apscheduler_elector_failed", election=self._elector.name)
            with self._lock:
                if self._scheduler.running:
                    self._scheduler.pause()

    async def _lead(self, token: FencingToken, stop: asyncio.Event) -> None:
        term = _Term(token)
        try:
            await self._slots.advance(token)  # from now on no former leader records a slot
            for fence in self._fences:
                await _maybe_await(fence.advance(token))
            if self._on_elected is not None:
                await _maybe_await(self._on_elected(token))
            term.recorded = self._recorded(await self._client.get_prefix(self._slots_prefix))
            self._skip_recorded(term.recorded)
        except Exception as err:
            self._taking_office_failed(token, err)
        if stop.is_set() or not self._begin_term(term):
            return
        try:
            await stop.wait()  # the elector cancels this task at once on a loss
        finally:
            self._end_term(term)

    async def _lost(self) -> None:
        assert self._on_lost is not None
        try:
            await _maybe_await(self._on_lost())
        except Exception as err:  # a failing hook must not end the campaign
            self._on_lost_failed(err)

    def _put_from_thread(self, token: FencingToken, key: str, value: str) -> None:
        """A plain job on an executor thread: the put runs on the scheduler's loop."""
        assert self._loop is not None
        put = self._slots.put(token, key, value)
        asyncio.run_coroutine_threadsafe(put, self._loop).result()

    async def shutdown(self, wait: bool = True) -> None:
        """Stop scheduling, wait for running jobs (``wait=True``: ``async def`` jobs
        and plain functions on executor threads alike; else ``async def`` jobs are
        cancelled), shut the scheduler down and resign. A second call does nothing."""
        if not self._claim_shutdown():
            return
        term = self._term
        if wait and term is not None and term.tasks:
            await asyncio.wait(set(term.tasks))
        if wait:
            await self._threads.idle()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)  # AsyncIOScheduler cannot block here
        self._elector.stop()
        if self._task is not None:
            await self._task

    async def __aenter__(self) -> AsyncLeaderScheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()


async def _maybe_await(result: Awaitable[Any] | Any) -> Any:
    return await result if inspect.isawaitable(result) else result
