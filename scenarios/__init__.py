"""Named, deterministic decode traces that every implementation replays identically."""

from .catalogue import PAPER, SCENARIOS, Scenario, generate
from .realtrace import read_requests_csv
from .scheduler import ScenarioError
from .trace import Trace, TraceError
from .trace.storage import load, save

__all__ = ["PAPER", "SCENARIOS", "Scenario", "ScenarioError", "Trace", "TraceError", "generate", "load",
           "read_requests_csv", "save"]
