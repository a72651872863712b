"""Shared fixtures and helpers for the test-suite."""

from __future__ import annotations

import pytest

from tests.registered import impl_params


@pytest.fixture(params=impl_params())
def impl_name(request: pytest.FixtureRequest) -> str:
    """Every registered implementation, by name (those unavailable here are skipped, with the reason)."""
    return request.param
