"""Hostile plug-ins (issue 27): real classes a user could load with ``--impl tests.hostile_plugins:Name``.

Each is the ``dict`` design (plain Python, so every call goes through its own methods in every regime) with one
misbehaviour, done after the design's own work where it can be, so that only the harness's guard can catch it:
writing into its inputs, raising exceptions outside the contract's, exiting, hanging, crashing, a 200 KB exception
message, an absurd ``table_nbytes``. :class:`Spy` behaves and records what it was handed, so a test can prove
that the others' inputs reached it untouched. Plug-ins that fail at import are written by the tests themselves
(a module with a SyntaxError cannot live in the repository: the linter parses it).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from impls.designs.dict_design import DictBlockManager

SPY_LOG = "KVB_SPY_LOG"  # the environment variable naming the file Spy appends to
HUGE = 200_000  # characters of HugeMessage's exception message (over 128 KiB)
FAILURES = Path(__file__).with_name("hostile_failures.json")  # what a run says of each failing plug-in


class FillsIdsInDecode(DictBlockManager):
    """Overwrites every id of its ``seq_ids`` with the first (``seq_ids[:] = seq_ids[0]``) after its step."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        cows = super().decode_step(seq_ids, cow_out, slot_out)
        if len(seq_ids):
            seq_ids[:] = seq_ids[0]
        return cows


class ReversesIdsInDecode(DictBlockManager):
    """Reverses its ``seq_ids`` in place after its step (a permutation: slot digests alone cannot see it)."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        cows = super().decode_step(seq_ids, cow_out, slot_out)
        seq_ids[:] = seq_ids[::-1].copy()
        return cows


class FillsIdsInLookup(DictBlockManager):
    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        super().lookup(seq_ids, slot_out)
        if len(seq_ids):
            seq_ids[:] = seq_ids[0]


class ReversesIdsInLookup(DictBlockManager):
    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        super().lookup(seq_ids, slot_out)
        seq_ids[:] = seq_ids[::-1].copy()


class RaisesInConstructor(DictBlockManager):
    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError("needs a GPU")


class AttributeErrorInCall(DictBlockManager):
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        return self.no_such_attribute


class IndexErrorInCall(DictBlockManager):
    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        slot_out[len(slot_out) + 5] = 0  # IndexError from NumPy, raised in this method


class PluginAbort(BaseException):
    """An exception outside Exception's hierarchy, as KeyboardInterrupt and SystemExit are."""


class RaisesBaseException(DictBlockManager):
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        raise PluginAbort("giving up")


class RaisesKeyboardInterrupt(DictBlockManager):
    """Raises KeyboardInterrupt itself (no one pressed Ctrl-C)."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        raise KeyboardInterrupt


class ExitsInDecode(DictBlockManager):
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        sys.exit(0)


class OsExitInCall(DictBlockManager):
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        os._exit(0)


class HangsInDecode(DictBlockManager):
    """Starts a helper process (as a plug-in, or our own callgrind study, may), then loops for ever."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        while True:
            pass


class HangsWhenFlagged(DictBlockManager):
    """Behaves until the file named by ``$KVB_HANG_FLAG`` exists; then says so (``<flag>.hanging``) and hangs."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        flag = os.environ.get("KVB_HANG_FLAG", "")
        if flag and os.path.exists(flag):
            open(os.path.splitext(flag)[0] + ".hanging", "w").close()
            while True:
                pass
        return super().decode_step(seq_ids, cow_out, slot_out)


class SegfaultsInCall(DictBlockManager):
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        return len(ctypes.string_at(0))  # reads address 0: SIGSEGV


class HugeMessage(DictBlockManager):
    """An exception whose message is 200,000 characters over many lines, with commas and quotes."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        raise RuntimeError(('a "long", story\n' * (HUGE // 16))[:HUGE])


class AbsurdTableBytes(DictBlockManager):
    def table_nbytes(self, seq_id: int) -> int | None:
        super().table_nbytes(seq_id)
        return 1e20


def in_studies() -> bool:
    """Whether the harness's studies job is on the stack (its timed replays are done then)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "run_studies":
            return True
        frame = frame.f_back
    return False


class FailsInStudies(DictBlockManager):
    """Behaves in the timed replays, raises in the studies (allocation counts, paced runs)."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        if in_studies():
            raise RuntimeError("only in the studies")
        return super().decode_step(seq_ids, cow_out, slot_out)


class CrashesInStudies(DictBlockManager):
    """Behaves in the timed replays, crashes its worker in the studies."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        if in_studies():
            os._exit(0)
        return super().decode_step(seq_ids, cow_out, slot_out)


class Spy(DictBlockManager):
    """Behaves, and appends to the file named by ``$KVB_SPY_LOG`` a line per ``decode_step`` and ``lookup``: the
    step (each manager replays from step 0), a digest of the ids it was handed and the manager's configuration
    (the run's quick contract check builds managers of its own)."""

    def __init__(self, num_blocks: int, block_size: int = 16, max_seqs: int = 256,
                 max_blocks_per_seq: int = 256) -> None:
        super().__init__(num_blocks, block_size, max_seqs, max_blocks_per_seq)
        self._steps = 0
        self._config = spy_config(num_blocks=num_blocks, block_size=block_size, max_seqs=max_seqs,
                                  max_blocks_per_seq=max_blocks_per_seq)

    def _record(self, call: str, step: int, seq_ids: np.ndarray) -> None:
        path = os.environ.get(SPY_LOG)
        if path:
            with open(path, "a", encoding="ascii") as log:
                log.write(f"{call} {step} {ids_digest(seq_ids)} {self._config}\n")

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        self._record("decode_step", self._steps, seq_ids)
        self._steps += 1
        return super().decode_step(seq_ids, cow_out, slot_out)

    def lookup(self, seq_ids: np.ndarray, slot_out: np.ndarray) -> None:
        self._record("lookup", self._steps - 1, seq_ids)
        super().lookup(seq_ids, slot_out)


def spy_config(**config: int) -> str:
    """A manager's configuration as one word of the spy's log."""
    return ",".join(f"{key}={config[key]}" for key in ("num_blocks", "block_size", "max_seqs", "max_blocks_per_seq"))


def ids_digest(seq_ids) -> str:
    """A digest of a batch's ids (as int64, in order)."""
    return hashlib.sha256(np.ascontiguousarray(seq_ids, dtype=np.int64).tobytes()).hexdigest()[:16]


# -- issue 36, item 3: answers the harness cannot use, memory, the process's state ------------------------------
class ReturnsNone(DictBlockManager):
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        super().decode_step(seq_ids, cow_out, slot_out)


class ReturnsText(DictBlockManager):
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        super().decode_step(seq_ids, cow_out, slot_out)
        return "no copies"


class ReturnsHuge(DictBlockManager):
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        super().decode_step(seq_ids, cow_out, slot_out)
        return 2**70


class ReturnsArray(DictBlockManager):
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        return np.full(3, super().decode_step(seq_ids, cow_out, slot_out))


class ExitsWithThree(DictBlockManager):
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        sys.exit(3)


class ExitsWithText(DictBlockManager):
    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        sys.exit("leaving now")


_HOARD: list = []  # what ExhaustsMemory keeps


class ExhaustsMemory(DictBlockManager):
    """Reserves address space (untouched, so no memory is used) until none is left, keeps it, and answers as
    ``dict``: what fails next is the harness's own allocation."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        cows = super().decode_step(seq_ids, cow_out, slot_out)
        size = 1 << 30
        while size >= 4096:
            try:
                _HOARD.append(np.empty(size, dtype=np.uint8))
            except MemoryError:
                size //= 2
        return cows


class ChangesCwdAndEnv(DictBlockManager):
    """Moves its process to the file system's root and changes its environment, after each step's work."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        cows = super().decode_step(seq_ids, cow_out, slot_out)
        os.chdir("/")
        os.environ["PYTHONPATH"] = "/nowhere"
        return cows


def _sabotaged(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
    raise RuntimeError("dict sabotaged by PatchesDict")


_DICT_DECODE = DictBlockManager.decode_step


class PatchesDict(DictBlockManager):
    """Replaces the registered ``dict`` class's ``decode_step`` with one that raises (in whatever process builds
    it), writes its process id to ``$KVB_PID_LOG``, and itself behaves."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        DictBlockManager.decode_step = _sabotaged
        path = os.environ.get("KVB_PID_LOG")
        if path:
            with open(path, "a", encoding="ascii") as log:
                log.write(f"{os.getpid()}\n")

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        return _DICT_DECODE(self, seq_ids, cow_out, slot_out)


class _StatesOnceBuilt(DictBlockManager):
    """Answers ``memory_bytes`` as ``dict`` while its constructor runs (which checks it), then :meth:`stated`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._built = True

    def memory_bytes(self) -> int:
        return self.stated() if getattr(self, "_built", False) else super().memory_bytes()


class StatesText(_StatesOnceBuilt):
    def stated(self) -> int:
        return "a few bytes"


class StatesNegative(_StatesOnceBuilt):
    def stated(self) -> int:
        return -1


class ExitsInMemoryBytes(_StatesOnceBuilt):
    def stated(self) -> int:
        sys.exit(1)


class SignalsItsSupervisor(DictBlockManager):
    """Sends SIGTERM to the process that started it, in its first step."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        os.kill(os.getppid(), signal.SIGTERM)
        return super().decode_step(seq_ids, cow_out, slot_out)


class InterruptsItsGroup(DictBlockManager):
    """Sends SIGINT to its own process group (as Ctrl-C in a terminal would), in its first step."""

    def decode_step(self, seq_ids: np.ndarray, cow_out: np.ndarray, slot_out: np.ndarray) -> int:
        os.killpg(0, signal.SIGINT)
        return super().decode_step(seq_ids, cow_out, slot_out)


def expected(*names: str) -> dict[str, tuple[str, set[str]]]:
    """The plug-ins ``names`` and what a run must say of them: the words of every reason and the regimes that must
    have failed (``tests/hostile_failures.json``, read by tests/test_hostile_plugins.py and test_isolation_cli.py)."""
    table = json.loads(FAILURES.read_text())
    return {name: (table[name][0], set(table[name][1])) for name in names}
