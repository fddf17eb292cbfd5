"""The pytest face of the kit: one parametrized test per scenario (imports pytest)."""

from __future__ import annotations

from typing import Any

import pytest

from . import run_scenario_named


def make_test(adapter: Any, fixture: str | None, names: list[str], kwargs: dict[str, Any]) -> Any:
    """The test function behind :func:`etcdfence.conformance.pytest_scenarios`."""
    if (adapter is None) == (fixture is None):
        raise TypeError("pytest_scenarios needs exactly one of adapter or fixture=")

    @pytest.mark.conformance
    @pytest.mark.parametrize("conformance_scenario", names)
    def test_conformance(
        conformance_scenario: str, etcd_endpoints: list[str], request: pytest.FixtureRequest
    ) -> None:
        target = adapter if fixture is None else request.getfixturevalue(fixture)
        result = run_scenario_named(target, conformance_scenario, etcd_endpoints, **kwargs)
        if result.status == "skip":
            pytest.skip(result.explanation)
        if result.status == "fail":
            pytest.fail(result.render(), pytrace=False)

    return test_conformance
