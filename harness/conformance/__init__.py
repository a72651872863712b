"""Conformance: does a BlockManager class behave like the reference model? Design: docs/measurement.md#conformance."""

from .check import Failure, Verdict, check, render_reproduction
from .idmap import IdMap
from .machine import CONFIG, CONFIGS, OPS, SENTINEL, ContractMachine, contract_machine, snapshot

__all__ = ["CONFIG", "CONFIGS", "OPS", "SENTINEL", "ContractMachine", "Failure", "IdMap", "Verdict", "check",
           "contract_machine", "render_reproduction", "snapshot"]
