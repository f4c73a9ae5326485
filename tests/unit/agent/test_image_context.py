"""The agent's image is built from the repository root: its build context keeps exactly what the Dockerfile copies."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_build_context_keeps_what_the_dockerfile_copies_and_nothing_else() -> None:
    """Without a .dockerignore the context was the whole checkout, its virtual environment (~1.4 GB) and git history
    included, sent to the builder on every build; with one, a path the Dockerfile copies must not be left out."""
    copied: set[str] = set()
    for line in (ROOT / "agent" / "Dockerfile").read_text().splitlines():
        if match := re.match(r"COPY (?!--from)(.+)", line):
            copied.update(match.group(1).split()[:-1])
    kept = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    ignored = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] not in "#!"]
    assert ignored[0] == "**"
    assert copied == kept
