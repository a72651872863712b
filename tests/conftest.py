"""Shared fixtures and helpers for the test-suite."""

from __future__ import annotations

import signal

import pytest

from tests.registered import impl_params

# A shell that starts the suite in the background (`make test &`, nohup, a CI wrapper without job control)
# hands it SIGINT ignored, and every process it starts inherits that: the tests of Ctrl-C would then send a
# signal nobody hears. The suite restores Python's own handler, which its child processes reset to the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
