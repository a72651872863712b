"""Shared fixtures and helpers for the test-suite."""

from __future__ import annotations

import signal

import pytest

from tests.registered import impl_params


@pytest.fixture(params=impl_params())
def impl_name(request: pytest.FixtureRequest) -> str:
    """Every registered implementation, by name (those unavailable here are skipped, with the reason)."""
    return request.param


@pytest.fixture
def no_hang():
    """A test that waits on a pipe (a FIFO nobody writes to) fails after 300 s instead of hanging the suite."""

    def timeout(signum, frame):
        raise TimeoutError("waited 300 s: hung on a FIFO or a pipe?")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(300)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
