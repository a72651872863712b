"""Shared fixtures and helpers for the test-suite."""

from __future__ import annotations

import pytest

from impls import REGISTRY


@pytest.fixture(params=sorted(REGISTRY))
def impl_name(request: pytest.FixtureRequest) -> str:
    """Every registered implementation, by name."""
    return request.param
