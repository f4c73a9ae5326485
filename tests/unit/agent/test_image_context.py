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


def test_the_image_installs_the_agents_dependencies_within_the_projects_own_ranges() -> None:
    """`pip install --no-deps .` skips pyproject's ranges, so the Dockerfile states them again: the same, or the image
    runs a boto3 the project no longer supports (it pinned >=1.35 while pyproject asks >=1.44)."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ranges = {re.split(r"[<>=\[]", d, maxsplit=1)[0]: d for d in declared}
    installed = re.findall(r'"([A-Za-z0-9_-]+[<>=][^"]*)"', (ROOT / "agent" / "Dockerfile").read_text())
    assert installed
    for requirement in installed:
        name = re.split(r"[<>=]", requirement, maxsplit=1)[0]
        assert ranges.get(name) == requirement, (requirement, ranges.get(name))
