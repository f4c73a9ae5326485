"""The `gpu-autoscaler` process at its end: what it built is frozen before the interpreter's shutdown collections
walk it (a tenth of `plan` on 10,000 pods); a program importing the app keeps Python's usual exit."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen" if gc.get_freeze_count() else "not frozen"))
sys.argv[:] = [{argv0!r}, "--version"]
from gpu_autoscaler.cli.main import app
app()
"""


def _exit_state(argv0: str) -> str:
    # The probe registers first, so it runs last (atexit is last in, first out): it sees the heap as the
    # interpreter's shutdown will.
    done = subprocess.run([sys.executable, "-c", _PROBE.format(argv0=argv0)], capture_output=True, text=True,
                          check=True, timeout=60)
    return done.stdout.splitlines()[-1]


def test_the_command_freezes_its_objects_before_the_shutdown_collections() -> None:
    assert _exit_state("/usr/local/bin/gpu-autoscaler") == "frozen"


def test_a_program_importing_the_app_exits_as_usual() -> None:
    assert _exit_state("my-tool") == "not frozen"
