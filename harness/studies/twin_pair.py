"""A compiled design beside its C++ twin, slice against slice. Design: docs/measurement.md#twin_pair."""

from __future__ import annotations

from harness.base.interleave import Driver
from harness.base.rows import Row
from harness.studies.cache_state import REPS, Evictor
from harness.studies.limit_loop import Yardstick, stick_rows
from impls import registry

TARGET = 1.05
METRICS = {"warm": "seq_step_twin_warm_ns", "cold": "seq_step_twin_cold_ns"}
RATIOS = {"warm": "seq_step_alone_warm_vs_cpp", "cold": "seq_step_alone_cold_vs_cpp"}


def twin_stick(impl: str) -> Yardstick | None:
    """``impl``'s C++ twin as a yardstick: None where it has none or the C++ library was not built here."""
    name = registry.cpp_twin(impl)
    if name is None:
        return None
    record = registry.record(name)
    try:
        cls = record.load()
    except ImportError:
        return None
    return Yardstick(name, cls, f"`{name}`, {record.description}", f"its C++ twin `{name}`",
                     f"`{impl}` and its C++ twin `{name}`, in turn on each slice in `{impl}`'s worker", METRICS,
                     RATIOS, impl=name)


def twin_rows(scenario: str, driver: Driver, evictor: Evictor, reps: int = REPS) -> list[Row]:
    """The twin's warm and cold rows and the design's ratio over each; none for a design without a twin."""
    stick = twin_stick(driver.impl) if driver.regime == "batched" and driver.kind == "compiled" else None
    return stick_rows(scenario, driver, [stick], evictor, reps) if stick else []
