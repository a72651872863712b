"""Rule 3, measured: getting each decode step's block tables to the GPU as the int32 tensor attention takes.

The flat design (:class:`impls.designs.flat.FlatBlockManager`) replays a trace untimed; in a window of decode steps
after a warm-up, right after each step's ``decode_step`` (the tables now hold the block of the token being
decoded), every variant below produces the batch's block tables as an int32 tensor on the device:

``a-per-seq``
    The anti-pattern: one host-to-device copy per live sequence, ``dev[row, :nblocks] <- table[row, :nblocks]``,
    then one device kernel widening the rows to int32.
``b-rebuild``
    What small engines do: pad the per-sequence Python lists of block ids to the longest (with ``PAD``),
    ``torch.tensor(padded, dtype=int32)`` (pinned on CUDA), then one copy into a freshly allocated device
    tensor. The lists are taken as the engine already holds them (built outside the timed region).
``c-one-copy``
    The article's rule: the manager's table *is* the persistent pinned buffer (its NumPy view is passed to
    the manager as ``table=``); one ``non_blocking`` copy of the rows spanning the live rows, all
    ``max_blocks_per_seq`` columns, then one device kernel widening them to int32.
``c-host-widen``
    (c) with the widening on the host: NumPy widens the live rows into a pinned int32 buffer (double
    buffered), one copy of twice the bytes, nothing to do on the device.
``d-changed-rows``
    Only the rows that changed since the previous step (a block appended, copied on write, or the row
    allocated or forked this step; found from the step's slot mapping and copy-on-write list, inside the
    timed region) are gathered into a pinned staging buffer; two copies (rows and their indices) and a
    device ``index_copy_`` into a persistent device mirror. A step where no row changed copies nothing.
``e-rows-changed``
    ``flat-rows``' answer (:mod:`harness.studies.table_copy.rows`): the device mirrors its row pool and
    directories, only the 64-byte rows the step wrote (and their directory entries) are copied and scattered
    into the mirror, and a device gather builds the int32 table. A ``flat-rows`` manager replays the same calls
    as the ``flat`` one (same block ids), so its table is checked against flat's like the others.
``d-live-cols``
    Only the live columns: the live rows' first ``max(nblocks)`` columns are packed into a contiguous pinned
    staging buffer (a strided source would make torch stage it through pageable memory), one copy, then
    widened on the device into the first columns of the device table.

Layouts. The live rows of these scenarios are rows ``0..n-1`` in decode order, so for (a), (c) and (d) the
device table is indexed by row id, like the host table (an engine passes row ids, or orders its batch by
row id, as vLLM does); rows outside the span are not copied. (b) is in batch order, ``[n, max(nblocks)]``.
Columns past a row's block count hold stale ids (or ``PAD`` in (b)); attention reads ``nblocks`` of them.
Per-row block counts and the live span are taken as given: an engine computes them for the attention
metadata anyway.

The uint16 ids travel as their 16 bits (torch dtype int16: a copy moves bytes, and torch's CPU copy of
uint16 has no vectorised kernel, which would skew the CPU figures); widening reads them as uint16.
Widening the uint16 ids to int32 is measured apart (metric ``table_widen_ns``, on the live rows):
``host-numpy`` (``np.copyto`` into an int32 array), ``host-torch`` (a dtype-converting torch copy on the
host) and ``device`` (the device kernel (a), (c) and (d) use).

Timing. Every variant runs on the same manager state each step, in an order rotated from step to step so
that none always runs cache-cold, with torch limited to one intra-op thread (see :func:`measure`). The
window is ``steps`` decode steps after ``warmup`` untimed ones; by default a budget of 76,800
sequence-steps (300 steps up to 256 sequences, 75 at 1,024), a few seconds a scenario. With CUDA the host
time includes recording the race guards' events: protecting the buffers is part of the cost.

Rows (:class:`harness.base.rows.Row`): ``impl`` is always ``"flat"`` (the design whose table is copied);
``regime`` is the variant (``a-per-seq`` ... ``d-live-cols``) or, for ``table_widen_ns``, where the widening
runs. Every value is the median over the measured steps (``table_copy_bytes_per_step``: the mean); :func:`measure`
also returns the raw per-step samples, keyed ``"<regime>/<metric>"`` (plus ``"steps"`` and ``"live"``).

- ``table_copy_ns``: host time per step (``perf_counter_ns``). Without CUDA a CPU torch tensor stands in for
  the device, so this is the whole packing and copy; with CUDA it is the time the host spends issuing it.
- ``table_copy_ns_per_seq``: the same divided by the number of live sequences.
- ``table_copy_device_ns``: with CUDA, CUDA events from the variant's first device operation to the end of
  its last (gaps while the host issues per-sequence copies included); without CUDA ``unavailable``.
- ``table_copy_bytes``: bytes handed to host-to-device copies per step; ``table_copies``: their number.
- ``table_copy_bytes_per_step``: the same bytes, their mean over the measured steps (times the step rate: the
  copy bandwidth the variant needs; the growth figures put it against the scale sweeps' sizes).
  (``d-changed-rows`` may copy nothing in a step; its device time is the median of the steps that copied.)
- ``table_widen_ns``: see above; ``device`` is ``unavailable`` without CUDA.

Without torch every row is ``unavailable`` ("needs torch"). Every measured step (CPU or CUDA) checks that
each variant's device tensor holds exactly the host's tables after the copy; a variant that fails the check,
or raises, gets ``failed`` rows.

The race. An asynchronous copy reads its pinned source when the GPU gets to it, maybe after the host has
moved on to the next step and written the buffer again. :class:`CopyGuard` (the manager's table, read in
place by (a) and (c): wait for the copy's event before the next step mutates the table) and
:class:`BufferRing` (staging buffers of (c-host-widen) and (d), double buffered: a buffer is reused only
after the copy that read it has finished) prevent it.

Run ``kvblock-bench table-copy --help``; ``scripts/gpu_check.sh`` produces the CUDA figures.
"""

from harness.studies.table_copy.guards import BufferRing, CopyGuard, DoneEvent, Event
from harness.studies.table_copy.measurement import default_steps, measure
from harness.studies.table_copy.rows import Copied
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
