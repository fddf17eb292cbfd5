"""Is my resource really fencing? The conformance kit for your own stores and services.

Every coordination library tells you that the *resource* must check the fencing token.
This kit checks that yours does: give it an :class:`Adapter` — ``write(token, key,
value)``, ``read(key)``, optionally ``restart()`` — and it runs, against real etcd
(tokens come from real locks; real lease expiry) and your real resource, the
scenarios in :data:`scenarios`: a zombie after a pause (Kleppmann's 33/34), a lower
token after a higher one, equal tokens of one term, a retried write whose reply was
lost, a lost write of the current term landing after later ones (with ``delay()``),
interleaved terms, concurrent writers of several terms (in processes), no or
malformed tokens, tokens passed through ``ETCDFENCE_TOKEN`` and the ``Fencing-Token``
header, a restart of the resource between terms (with ``restart()``), and tokens
beyond 2**53. Each result says pass/fail with the offending history (the history
checker of :mod:`etcdfence.testing.history`, plus the kit's own checks)::

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

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import Client
from ..errors import InvalidArgumentError
from ._adapter import Adapter, as_adapter, build, load_factory
from ._kit import Kit, Scenario, run_scenario
from ._report import Finding, Report, ScenarioResult
from ._scenarios import SCENARIOS
from ._writers import KitError

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
    except Exception as err:  # the user's factory: its error, said plainly
        raise KitError(f"the adapter factory failed: {type(err).__name__}: {err}") from err


def run_conformance(
    adapter: Any,
    endpoints: list[str] | None = None,
    *,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    ttl: int = 2,
    timeout: float = 5.0,
    on_result: Callable[[ScenarioResult], Any] | None = None,
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
    """
    selected = _select(only, skip)
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= 60:
        raise InvalidArgumentError(f"ttl must be an int number of seconds in 1..60, got {ttl!r}")
    started = time.monotonic()
    server = None
    if endpoints is None:
        from ..testing import EtcdServer

        server = EtcdServer().start()
        endpoints = server.endpoints
    try:
        with Client(list(endpoints), timeout=timeout) as client:
            client.revision()  # etcd answers, or EtcdUnavailableError now, not per scenario
            resolved, spec, factory = _resolve(adapter, list(endpoints))
            name = spec or resolved.name or getattr(factory, "__name__", "") or "adapter"
            kit = Kit(resolved, client, list(endpoints), spec=spec, factory=factory, ttl=ttl,
                      run_id=uuid.uuid4().hex[:10])  # fmt: skip
            results = []
            try:
                for scenario in selected:
                    results.append(run_scenario(kit, scenario))
                    if on_result is not None:
                        on_result(results[-1])
            finally:
                if factory is not None:  # built here; an adapter handed in stays open
                    resolved.shutdown()
    finally:
        if server is not None:
            server.stop()
    return Report(name, list(endpoints), results, time.monotonic() - started)


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
