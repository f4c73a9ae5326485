"""The Node.js the CDK needs, checked before anything starts it.

aws-cdk-lib for Python runs on jsii, which starts a Node.js process at the first `import aws_cdk`. jsii
supports Node.js 22 and 24 (its support policy, printed by the jsii runtime itself); on an end-of-life Node.js
it still works but prints an eleven-line banner on every synth. This check says the same in one line, naming
what to install, and then tells jsii (`JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION`, the major versions it
should not warn about again) that the warning has been given. Without Node.js at all, synth cannot run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import MutableMapping
    from typing import TextIO

__all__ = ["SILENCE_END_OF_LIFE", "SUPPORTED_NODE_MAJORS", "check_node", "main", "node_message", "node_version"]

SUPPORTED_NODE_MAJORS = (22, 24)
SILENCE_END_OF_LIFE = "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def node_version() -> str | None:
    """`node --version` (`v22.11.0`), or None when there is no Node.js on the PATH."""
    node = shutil.which("node")
    if node is None:
        return None
    result = subprocess.run([node, "--version"], capture_output=True, text=True, check=False, timeout=30)
    return result.stdout.strip() or None


def _major(version: str) -> int | None:
    match = _VERSION.match(version)
    return int(match.group(1)) if match else None


def node_message(version: str | None) -> str | None:
    """One line when this Node.js is missing or not supported by jsii, else None."""
    wanted = " or ".join(str(major) for major in SUPPORTED_NODE_MAJORS)
    if version is None:
        return f"gpu-autoscaler: Node.js not found; the CDK (jsii) needs Node.js {wanted} on the PATH"
    major = _major(version)
    if major is None or major < min(SUPPORTED_NODE_MAJORS):
        return (f"gpu-autoscaler: Node.js {version} is past end of life for the CDK (jsii); install Node.js "
                f"{wanted} (synth still runs for now)")
    return None


def check_node(version: str | None, environ: MutableMapping[str, str] = os.environ,
               stream: TextIO | None = None) -> str | None:
    """Print the one line if there is something to say about `version` (from `node_version()`), and keep jsii
    from repeating it at length."""
    message = node_message(version)
    if message is not None:
        print(message, file=stream or sys.stderr)
        major = _major(version) if version else None
        if major is not None:
            silenced = [m.strip() for m in environ.get(SILENCE_END_OF_LIFE, "").split(",") if m.strip()]
            environ[SILENCE_END_OF_LIFE] = ",".join(dict.fromkeys([*silenced, str(major)]))
    return message


def main() -> int:
    """`python -m infra.node` (run by `make setup`): fails only when synth cannot run at all."""
    version = node_version()
    if check_node(version) is None:
        print(f"Node.js {version}: supported by the CDK (jsii)")
    return 1 if version is None else 0


if __name__ == "__main__":
    raise SystemExit(main())
