"""The `gpu-autoscaler` process sets what its libraries would otherwise spend CPU on, unless the user chose:
OpenBLAS on one thread (numpy's OpenBLAS otherwise starts a worker per core that spins for 50-110 ms of CPU
after numpy loads, work no command gives it), pydantic's plugins off (looking for them reads every installed
distribution's metadata). A program importing the app keeps its environment as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = """
import os, sys
sys.argv[:] = [{argv0!r}, "plan", "--help"]
from gpu_autoscaler.cli.main import app
import numpy
from pydantic.plugin import _loader
print("blas threads:", os.environ.get("OPENBLAS_NUM_THREADS"))
print("process threads:", len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else "unknown")
print("plugins disabled:", os.environ.get("PYDANTIC_DISABLE_PLUGINS"))
print("plugins looked for:", _loader._plugins is not None)
"""
_VARIABLES = ("OPENBLAS_NUM_THREADS", "PYDANTIC_DISABLE_PLUGINS")


def _probe(argv0: str, **env: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k not in _VARIABLES} | env
    done = subprocess.run([sys.executable, "-c", _PROBE.format(argv0=argv0)], capture_output=True, text=True,
                          check=False, timeout=60, env=environment)
    assert done.returncode == 0, done.stderr
    return dict(line.split(": ", 1) for line in done.stdout.splitlines()
                if line.startswith(("blas", "process", "plugins")))


def test_the_command_runs_openblas_on_one_thread() -> None:
    seen = _probe("/usr/local/bin/gpu-autoscaler")
    assert seen["blas threads"] == "1"
    if Path("/proc/self/task").is_dir():
        assert seen["process threads"] == "1"  # numpy loaded, no OpenBLAS worker started


def test_the_command_does_not_look_for_pydantic_plugins() -> None:
    seen = _probe("/usr/local/bin/gpu-autoscaler")
    assert (seen["plugins disabled"], seen["plugins looked for"]) == ("__all__", "False")  # models were built


def test_the_users_choices_are_kept() -> None:
    seen = _probe("/usr/local/bin/gpu-autoscaler", OPENBLAS_NUM_THREADS="4", PYDANTIC_DISABLE_PLUGINS="logfire")
    assert (seen["blas threads"], seen["plugins disabled"], seen["plugins looked for"]) == ("4", "logfire", "True")


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no worker on one core")
def test_a_program_importing_the_app_keeps_its_environment() -> None:
    seen = _probe("my-tool")
    assert (seen["blas threads"], seen["plugins disabled"], seen["plugins looked for"]) == ("None", "None", "True")
    assert seen["process threads"] != "1"
