"""The Node.js check: one line naming what to install, and jsii's own banner not repeated after it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from infra.node import SILENCE_END_OF_LIFE, check_node, node_message

ROOT = Path(__file__).resolve().parents[2]


def test_supported_node_says_nothing() -> None:
    assert node_message("v22.11.0") is None and node_message("v24.1.0") is None


def test_end_of_life_node_gets_one_line_and_jsii_is_told_it_was_said() -> None:
    environ: dict[str, str] = {SILENCE_END_OF_LIFE: "18"}
    stream = io.StringIO()
    message = check_node("v20.20.2", environ, stream)
    assert message is not None and "v20.20.2" in message and "22 or 24" in message
    assert stream.getvalue().count("\n") == 1
    assert environ[SILENCE_END_OF_LIFE] == "18,20"


def test_missing_node_is_said_and_nothing_is_silenced() -> None:
    environ: dict[str, str] = {}
    message = check_node(None, environ, io.StringIO())
    assert message is not None and "not found" in message and environ == {}


def test_app_py_checks_before_anything_starts_jsii() -> None:
    """`python app.py` (what `cdk synth` runs) with a bad configuration: the check's line comes first and no
    eleven-line banner follows on this machine's Node.js."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "layers" / "core"), str(ROOT)])}
    env.pop(SILENCE_END_OF_LIFE, None)
    result = subprocess.run([sys.executable, "-c", "import app, sys; sys.argv=['app']; app.main()"], cwd=ROOT,
                            env={**env, "CDK_CONTEXT_JSON": '{"gpu-autoscaler": {"clusterName": "x"}}'},
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0 and "region" in result.stderr
    assert "is end-of-life and not supported anymore" not in result.stderr + result.stdout
