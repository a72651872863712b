"""Contract conformance: does a BlockManager class behave like the reference model?

>>> from harness.conformance import check
>>> verdict = check(MyBlockManager, seeds=(0, 1), max_examples=100)
>>> verdict.ok, print(verdict.reproduction)

:func:`check` runs a Hypothesis state machine (:func:`contract_machine`) that drives the class and
:class:`impls.core.reference.ReferenceModel` with the same random valid and invalid calls and compares them
after every call, up to a renaming of block ids (:class:`IdMap`). The project's own test-suite runs the same
machine on every registered implementation (``tests/test_contract_stateful.py``).
"""

from .check import Failure, Verdict, check, render_reproduction
from .idmap import IdMap
from .machine import CONFIG, CONFIGS, OPS, SENTINEL, ContractMachine, contract_machine, snapshot

__all__ = ["CONFIG", "CONFIGS", "OPS", "SENTINEL", "ContractMachine", "Failure", "IdMap", "Verdict", "check",
           "contract_machine", "render_reproduction", "snapshot"]
