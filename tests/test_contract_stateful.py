"""Every registered implementation conforms to the contract, by the checker users run (harness.conformance).

One test per implementation, so that a failure names it and prints the shrunk calls as a runnable script.
The checker itself is tested on deliberately broken implementations: it must fail them, and its printed
reproduction must raise the same assertion when run.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from harness.base.threads import one_intra_op_thread
from harness.conformance import check
from impls import REGISTRY
from impls.contenders import nano_vllm
from impls.contenders.nano_vllm import NanoVllmBlockManager
from impls.designs.list_design import ListBlockManager
from tests.registered import impl_params

EXAMPLES = int(os.environ.get("KVB_HYPOTHESIS_EXAMPLES", "50"))
# Unset: a fresh random seed per run (explores more over time); the verdict names it, so a failure can be
# rerun with KVB_HYPOTHESIS_SEED=<seed>.
SEED = int(os.environ["KVB_HYPOTHESIS_SEED"]) if os.environ.get("KVB_HYPOTHESIS_SEED") else None


@pytest.mark.parametrize("name", impl_params())
def test_implementation_conforms(name: str) -> None:
    with one_intra_op_thread():  # a block manager runs on one host thread (harness.base.threads)
        verdict = check(REGISTRY[name], seeds=(SEED,), max_examples=EXAMPLES)
    if not verdict.ok:
        pytest.fail(str(verdict), pytrace=False)


class SkipsSharedDecrement(ListBlockManager):
    """Broken on purpose: ``free`` forgets to drop its reference to blocks it shares with another sequence."""

    def _free(self, seq_id: int) -> None:
        table = self._tables[seq_id]
        self._tables[seq_id] = None
        for block in reversed(table):
            if self._refs[block] == 1:
                self._refs[block] = 0
                self._free_list.append(block)


class SkipsLastSlotWrite(ListBlockManager):
    """Broken on purpose: ``decode_step`` never writes the slot of the last sequence in the step."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        scratch = slot_out.copy()
        ncow = super().decode_step(seq_ids, cow_out, scratch)
        n = len(seq_ids)
        slot_out[: n - 1] = scratch[: n - 1]
        return ncow


class EngineArithmetic(NanoVllmBlockManager):
    """Broken on purpose: nano-vllm's own ``len % block_size == 1``, which never opens a block at block size 1."""

    unit_block_manager = nano_vllm.BlockManager


# Each broken class is checked on the operations that reach its bug, which keeps shrinking quick.
BROKEN = [
    pytest.param(SkipsSharedDecrement, ("allocate", "fork", "free"), "ref count of block", id="skips-decrement"),
    pytest.param(SkipsLastSlotWrite, ("allocate", "decode_step"), "did not write slot_out", id="skips-slot-write"),
    # the hash bookkeeping reads the block the append never opened
    pytest.param(EngineArithmetic, ("allocate", "append_slot"), "list index out of range", id="block-size-1"),
]


@pytest.mark.parametrize(("broken", "ops", "complaint"), BROKEN)
def test_checker_fails_a_broken_implementation(broken: type, ops: tuple[str, ...], complaint: str) -> None:
    verdict = check(broken, seeds=(0,), max_examples=200, ops=ops)
    assert not verdict.ok
    (failure,) = verdict.failures
    assert failure.error_type == "AssertionError" and complaint in failure.message, failure
    assert f"block size {failure.config['block_size']}, " in str(failure)
    assert len(failure.calls) <= 6, verdict.reproduction  # shrunk to a handful of calls
    with pytest.raises(AssertionError) as replayed:
        exec(compile(verdict.reproduction, "<reproduction>", "exec"), {})
    assert str(replayed.value) == failure.message


def test_checker_refuses_unknown_operations() -> None:
    with pytest.raises(ValueError, match="unknown"):
        check(ListBlockManager, ops=("allocate", "defragment"))
