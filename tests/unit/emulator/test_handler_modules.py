"""A handler run in a process that hosts other functions drops its own modules only (`invoke --launch-first`)."""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

from gpu_autoscaler.emulator.handlers import forget_function_modules, handler_module_name

if TYPE_CHECKING:
    from pathlib import Path


def _module(name: str, file: Path) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = str(file)
    return module


def test_forgetting_a_functions_modules_leaves_another_environments_handler_alone(tmp_path: Path) -> None:
    """The emulator's host loads the drain function's handler in another thread while the interruption handler
    runs beside it: the interruption's clean-up must not drop the drain's module (nor fail when the host has
    dropped it already)."""
    before = set(sys.modules)
    own = _module(handler_module_name("interruption"), tmp_path / "interruption" / "handler.py")
    sibling = _module("_test_interruption_helper", tmp_path / "interruption" / "helper.py")
    other = _module(handler_module_name("drain"), tmp_path / "drain" / "handler.py")
    sys.modules.update({m.__name__: m for m in (own, sibling, other)})
    try:
        forget_function_modules(tmp_path / "interruption", before, "interruption")
        assert own.__name__ not in sys.modules and sibling.__name__ not in sys.modules
        assert sys.modules.get(other.__name__) is other
    finally:
        for m in (own, sibling, other):
            sys.modules.pop(m.__name__, None)
