"""The `gpu-autoscaler` process and the garbage collector: the command's modules are imported without
collections and frozen, the collector is back on for the command, and what it built is frozen before the
interpreter's shutdown collections walk it (a tenth of `plan` on 10,000 pods). A program importing the app
keeps Python's usual collector and exit."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("at exit:", "frozen" if gc.get_freeze_count() else "not frozen"))
sys.argv[:] = [{argv0!r}, "plan", "--help"]
from gpu_autoscaler.cli.main import app
print("imported:", "frozen" if gc.get_freeze_count() else "not frozen", "collector", gc.isenabled())
app()
"""


def _gc_states(argv0: str) -> list[str]:
    # The probe registers first, so it runs last (atexit is last in, first out): it sees the heap as the
    # interpreter's shutdown will.
    done = subprocess.run([sys.executable, "-c", _PROBE.format(argv0=argv0)], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.startswith(("imported:", "at exit:"))]


def test_the_command_freezes_its_modules_and_what_it_built_and_leaves_the_collector_on() -> None:
    assert _gc_states("/usr/local/bin/gpu-autoscaler") == ["imported: frozen collector True", "at exit: frozen"]


def test_a_program_importing_the_app_keeps_the_usual_collector_and_exit() -> None:
    assert _gc_states("my-tool") == ["imported: not frozen collector True", "at exit: not frozen"]
