"""Who may define the Python drivers' untimed per-step hook ``untimed_after_step``: the calibration's adapters
and registry records marked ``untimed_hook``; any other design is refused before its replay."""

from __future__ import annotations

import sys
from collections.abc import Callable

from harness.base.replay import ReplayError
from impls import registry

HOOK = "untimed_after_step"


def _adapter_base() -> type | None:
    """The calibration's adapter base class, if it was imported (only the calibration imports it)."""
    module = sys.modules.get("harness.engines.adapter")
    return getattr(module, "EngineAdapter", None)


def hook_allowed(cls: type) -> bool:
    """Whether ``cls`` may define the hook: a calibration adapter, or a registry record marked ``untimed_hook``."""
    base = _adapter_base()
    if base is not None and issubclass(cls, base):
        return True
    for record in registry.RECORDS:
        module, _, attr = record.target.partition(":")
        if record.untimed_hook and getattr(sys.modules.get(module), attr, None) is cls:
            return True
    return False


def hook_problem(cls: type) -> str:
    """Why ``cls`` may not be replayed with its hook; "" when it defines none or may."""
    if getattr(cls, HOOK, None) is None or hook_allowed(cls):
        return ""
    return (f"{cls.__name__} defines {HOOK}, the harness's untimed per-step hook, which only the calibration's "
            "adapters and registered contenders marked for it may use: do that work in the timed calls")


def untimed_hook(mgr: object) -> Callable[[int], None] | None:
    """``mgr``'s untimed per-step hook, None without one; :class:`ReplayError` for a design that may not use it."""
    after = getattr(mgr, HOOK, None)
    if after is None:
        return None
    problem = hook_problem(type(mgr))
    if problem:
        raise ReplayError(problem)
    return after
