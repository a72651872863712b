"""Benchmarks time only when asked: under plain ``pytest`` (``make test``) each runs once, untimed, so the
suite is exercised on every change without costing a minute; ``make bench-ops`` passes ``--benchmark-enable``."""

from __future__ import annotations

import pytest

# Options that ask for timings; any of them keeps the benchmarks enabled.
_TIMING_OPTIONS = ("benchmark_enable", "benchmark_only", "benchmark_json", "benchmark_save", "benchmark_autosave",
                   "benchmark_compare")


def pytest_configure(config: pytest.Config) -> None:
    # Runs before pytest-benchmark's own pytest_configure (registered trylast), which reads the option.
    if not any(config.getoption(name, default=None) for name in _TIMING_OPTIONS):
        config.option.benchmark_disable = True
