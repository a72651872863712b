"""Rule 3, measured: each decode step's block tables to the GPU as int32. Design: docs/measurement.md#table_copy."""

from harness.studies.table_copy.copied import Copied
from harness.studies.table_copy.guards import BufferRing, CopyGuard, DoneEvent, Event
from harness.studies.table_copy.measurement import default_steps, measure
from harness.studies.table_copy.variants import (
    COPY_METRICS,
    MAX_STEPS,
    MIN_STEPS,
    NEEDS_TORCH,
    TABLE_ENTRIES,
    UNITS,
    VARIANTS,
    WIDEN,
    StepState,
    TableCopyBench,
    gather_tables,
    padded_lists,
    step_state,
)

__all__ = [
    "COPY_METRICS",
    "MAX_STEPS",
    "MIN_STEPS",
    "NEEDS_TORCH",
    "TABLE_ENTRIES",
    "UNITS",
    "VARIANTS",
    "WIDEN",
    "BufferRing",
    "Copied",
    "CopyGuard",
    "DoneEvent",
    "Event",
    "StepState",
    "TableCopyBench",
    "default_steps",
    "gather_tables",
    "measure",
    "padded_lists",
    "step_state",
]
