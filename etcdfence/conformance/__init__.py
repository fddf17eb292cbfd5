"""Is my resource really fencing? The conformance kit for your own stores and services.

Every coordination library tells you that the *resource* must check the fencing token.
This kit checks that yours does: give it an :class:`Adapter` — ``write(token, key,
value)``, ``read(key)``, optionally ``restart()`` — and it runs, against real etcd
(tokens come from real locks; real lease expiry) and your real resource, the
scenarios in :data:`scenarios`: a zombie after a pause (Kleppmann's 33/34), a
zombie that wakes ``zombie_delay`` seconds after the newer term wrote (a mark that
expires fails), a lower token after a higher one, equal tokens of one term, a
retried write whose reply was lost, a lost write of the current term landing after
later ones (with ``delay()``), interleaved terms, concurrent writers of several
terms (in processes) released together by a start barrier, several keys per round,
for many rounds with start offsets that sweep the race window (a check-then-write
races), no or malformed tokens, tokens passed through
``ETCDFENCE_TOKEN`` and the ``Fencing-Token`` header, a restart of the resource
between terms (with ``restart()``), tokens across powers of ten (999 vs 1000: text
comparison fails) and tokens beyond 2**53.

Every call to the adapter has a deadline (``deadline=``, 10 s): a write with no
answer by then is recorded as indeterminate — its outcome unknown, it may still
land — and the kit goes on; a write that waited behind an earlier one (a held
COMMIT's row lock) and lands after it is ordered, not a failure. A resource that
never answers is *stuck*: the scenarios left fail at once, and the run always ends
with a verdict. Each result says pass/fail with the offending history (the history
checker of :mod:`etcdfence.history`, plus the kit's own checks)::

    from etcdfence.conformance import Adapter, run_conformance
    report = run_conformance(Adapter(write=store.put, read=store.get), endpoints=[...])
    assert report.ok, report

Three ways to use it: :func:`run_conformance` from code, ``python -m
etcdfence.conformance package.module:factory`` from a shell or CI, and
:func:`pytest_scenarios` for one pytest test per scenario.

Give a ``"module:factory"`` (a function returning the adapter) rather than an
adapter object when you can: the concurrent-writers and environment scenarios then
run real writer processes that each build their own adapter. Use a scratch store or
namespace: the kit writes keys under ``etcdfence-conformance/<run>/`` and, in its
last scenario, tokens near int64's limit.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from .. import Client
from ..errors import InvalidArgumentError
from ._adapter import Adapter, as_adapter, build, describe, load_factory
from ._kit import DEADLINE, Home, Kit, Scenario, run_scenario
from ._report import Finding, Report, ScenarioResult
from ._scenarios import SCENARIOS
from ._writers import WRITER_TIMEOUT, KitError

__all__ = [
    "Adapter",
    "Finding",
    "KitError",
    "Report",
    "Scenario",
    "ScenarioResult",
    "load_factory",
    "pytest_scenarios",
    "run_conformance",
    "run_scenario_named",
    "scenario_names",
    "scenarios",
]

#: Every scenario of the kit, in the order it runs them (``.name``, ``.title``).
scenarios: tuple[Scenario, ...] = SCENARIOS


def scenario_names() -> list[str]:
    """The scenarios' names, in run order (what ``only=``/``skip=`` take)."""
    return [scenario.name for scenario in SCENARIOS]


def _select(only: Iterable[str] | None, skip: Iterable[str]) -> list[Scenario]:
    names = scenario_names()
    wanted = list(names if only is None else only)
    unwanted = set(skip)
    unknown = sorted((set(wanted) | unwanted) - set(names))
    if unknown:
        raise InvalidArgumentError(f"unknown scenario(s) {unknown}; known: {names}")
    return [s for s in SCENARIOS if s.name in wanted and s.name not in unwanted]


def _resolve(
    adapter: Any, endpoints: list[str]
) -> tuple[Adapter, str | None, Callable[..., Any] | None]:
    """(adapter, spec, factory) from what the caller gave."""
    if isinstance(adapter, str):
        factory = load_factory(adapter)
        return _built(factory, endpoints), adapter, factory
    is_instance = isinstance(adapter, (Adapter, Mapping)) or (
        not isinstance(adapter, type) and hasattr(adapter, "write") and hasattr(adapter, "read")
    )
    if is_instance:
        return as_adapter(adapter), None, None
    if callable(adapter):
        return _built(adapter, endpoints), None, adapter
    raise InvalidArgumentError(f"not an adapter or factory: {adapter!r}")


def _built(factory: Callable[..., Any], endpoints: list[str]) -> Adapter:
    """``build``, with a factory's own failure reported as the kit's error."""
    try:
        return build(factory, endpoints)
    except InvalidArgumentError:
        raise
    except BaseException as err:  # the user's factory (SystemExit too): said plainly
        raise KitError(f"the adapter factory failed: {describe(err)}") from None


def run_conformance(
    adapter: Any,
    endpoints: list[str] | None = None,
    *,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    ttl: int = 2,
    timeout: float = 5.0,
    on_result: Callable[[ScenarioResult], Any] | None = None,
    deadline: float = DEADLINE,
    zombie_delay: float = 10.0,
) -> Report:
    """Run the scenarios against ``adapter`` and return the :class:`Report`.

    ``adapter`` is an :class:`Adapter` (or a ``dict``/object with ``write`` and
    ``read``), a zero-argument factory returning one, or ``"package.module:factory"``
    — the last runs concurrent writers as real processes. A factory that takes an
    ``endpoints`` keyword gets the etcd endpoints. ``endpoints=None`` starts an
    embedded etcd (:class:`etcdfence.testing.EtcdServer`) for the run. ``only`` /
    ``skip`` pick scenarios by name; ``ttl`` is the lease TTL of the zombie's term
    (the zombie scenario waits about that long for etcd to expire it);
    ``on_result`` is called after each scenario (progress output).

    ``deadline`` (seconds, default 10) bounds every call the kit makes to the
    adapter: a write with no answer by then is recorded as indeterminate (outcome
    unknown, it may still land) and the kit goes on — a write that waited behind an
    earlier one (a held COMMIT's lock) and lands after it is ordered, not a failure.
    One still unanswered three deadlines later makes the resource *stuck*: the
    scenarios left fail at once, so the kit always ends with a verdict.
    ``zombie_delay`` (seconds, default 10) is how long the late zombie sleeps,
    with no write of the kit to any key meanwhile, before its stale write: a
    fencing mark that expires sooner fails that scenario — one that expires later
    passes, so set it above your store's mark TTL. (Before the sleep the newer term
    writes 32 other keys: a mark evicted from a bounded cache fails too.)

    Whatever the adapter raises is a finding (``SystemExit`` and ``KeyboardInterrupt``
    too); a ``close()`` that raises or hangs is a warning of the report
    (``report.warnings``). An adapter object that works only on the thread that built
    it (a ``sqlite3`` connection) is called on the thread that called this function;
    a factory is called on each thread that uses its adapter.
    """
    selected = _select(only, skip)
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= 60:
        raise InvalidArgumentError(f"ttl must be an int number of seconds in 1..60, got {ttl!r}")
    for name, value in (("deadline", deadline), ("zombie_delay", zombie_delay)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise InvalidArgumentError(
                f"{name} must be a positive number of seconds, got {value!r}"
            )
    started = time.monotonic()
    server = None
    if endpoints is None:
        from ..testing import EtcdServer

        server = EtcdServer().start()
        endpoints = server.endpoints
    home = Home()  # adapter calls run there (a factory's adapter is built there too)
    try:
        with Client(list(endpoints), timeout=timeout) as client:
            client.revision()  # etcd answers, or UnavailableError now, not per scenario
            resolved, spec, factory = home.call(
                _resolve, adapter, list(endpoints), timeout=WRITER_TIMEOUT,
                what="the adapter factory",
            )  # fmt: skip
            name = spec or resolved.name or getattr(factory, "__name__", "") or "adapter"
            kit = Kit(resolved, client, list(endpoints), spec=spec, factory=factory, ttl=ttl,
                      run_id=uuid.uuid4().hex[:10], deadline=float(deadline),
                      zombie_delay=float(zombie_delay), home=home)  # fmt: skip
            if spec is None and factory is None and _bound_to_caller(kit):
                results = _on_the_callers_thread(kit, selected, on_result)
            else:
                results = _run_all(kit, selected, on_result)
    finally:
        home.stop()
        if server is not None:
            server.stop()
    seconds = time.monotonic() - started
    return Report(name, list(endpoints), results, seconds, kit.warnings, resolved.bound_lock)


def _run_all(
    kit: Kit, selected: list[Scenario], on_result: Callable[[ScenarioResult], Any] | None
) -> list[ScenarioResult]:
    """Every selected scenario in turn; then close an adapter the kit built."""
    results = []
    try:
        for scenario in selected:
            results.append(run_scenario(kit, scenario))
            if on_result is not None:
                on_result(results[-1])
    finally:
        if kit.factory is not None and not kit.stuck:  # an adapter handed in stays open
            _shut(kit)
    return results


def _bound_to_caller(kit: Kit) -> bool:
    """Whether an adapter handed in works only on the caller's thread (where it was
    most likely built: a ``sqlite3`` connection by default): a read on the home thread
    raises, the same read here does not."""
    key = kit.layout.data_key("thread-probe")
    try:
        kit.home.call(kit.adapter.read_text, key, timeout=kit.deadline + kit.settle,
                      what=f"read({key!r})")  # fmt: skip
        return False
    except KitError as err:  # no answer: the scenarios fail at once, with the reason
        kit.stuck = f"the resource is stuck: {err}"
        return False
    except Exception:
        pass
    try:
        kit.adapter.read_text(key)
    except BaseException:
        return False
    return True


def _on_the_callers_thread(
    kit: Kit, selected: list[Scenario], on_result: Callable[[ScenarioResult], Any] | None
) -> list[ScenarioResult]:
    """Run the scenarios on a thread of their own while this thread (the caller's)
    serves the adapter's calls: an adapter bound to its thread works, and its calls
    keep their deadlines (a call that never returns holds this thread, though: give a
    factory to have such a resource bounded too)."""
    kit.bound = True
    kit.home = Home(thread=False)
    driver: Future[list[ScenarioResult]] = Future()

    def drive() -> None:
        try:
            driver.set_result(_run_all(kit, selected, on_result))
        except BaseException as err:  # handed to the caller
            driver.set_exception(err)
        finally:
            kit.home.stop()

    threading.Thread(target=drive, name="conformance-driver", daemon=True).start()
    kit.home.serve()
    return driver.result()


def _shut(kit: Kit) -> None:
    """Close an adapter the kit built, on its home thread, waiting at most the deadline:
    a close() that fails or hangs is a warning of the report (the verdict stands)."""
    try:
        kit.home.call(kit.adapter.shutdown, timeout=kit.deadline, what="the adapter's close()")
    except Exception as err:
        kit.warnings.append(f"closing the adapter: {describe(err)}")


def run_scenario_named(
    adapter: Any, name: str, endpoints: list[str] | None = None, **kwargs: Any
) -> ScenarioResult:
    """Run the one scenario ``name`` (what each test of :func:`pytest_scenarios` does)."""
    return run_conformance(adapter, endpoints, only=[name], **kwargs).results[0]


def pytest_scenarios(
    adapter: Any = None,
    *,
    fixture: str | None = None,
    names: Iterable[str] | None = None,
    **kwargs: Any,
) -> Any:
    """A pytest test function parametrized with one test per scenario::

        from etcdfence.conformance import pytest_scenarios
        test_my_store = pytest_scenarios("mypkg.store:make_adapter")
        test_other = pytest_scenarios(fixture="other_adapter")   # a fixture of yours

    ``adapter`` is what :func:`run_conformance` takes; ``fixture`` names a fixture
    returning one instead (built per test); ``names`` limits the scenarios (default:
    all). etcd comes from the ``etcd_endpoints``
    fixture of etcdfence's pytest plugin. Each test is marked ``conformance``,
    fails with the scenario's report (history included) and is skipped when the
    scenario cannot run (no ``restart()``). ``kwargs`` go to :func:`run_conformance`.
    """
    from ._pytest import make_test

    return make_test(adapter, fixture, [s.name for s in _select(names, ())], kwargs)
