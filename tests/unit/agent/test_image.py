"""The agent's image (agent/Dockerfile) holds every third-party distribution the agent imports, within the project's
own ranges, and its build context (the repository root, trimmed by .dockerignore) keeps what it copies.

The image installs a few named distributions, then the project with `--no-deps`: anything else the agent imports,
directly or through `gpu_autoscaler`, is missing there, and the container dies at import (ModuleNotFoundError)
before it serves a probe — while every other test passes, as they run in the development environment.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT

DOCKERFILE = ROOT / "agent" / "Dockerfile"
OPTIONAL = frozenset({"blinker"})
"""Imported inside `try: … except ImportError` (oauthlib.signals, under kubernetes' requests-oauthlib): harmless when
absent."""

_IMPORTED = """
import importlib, json, pkgutil, sys
before = set(sys.modules)
import gpu_autoscaler_agent
for module in pkgutil.walk_packages(gpu_autoscaler_agent.__path__, "gpu_autoscaler_agent."):
    importlib.import_module(module.name)
new = {name.split(".")[0] for name in set(sys.modules) - before}
print(json.dumps(sorted(name for name in new if getattr(sys.modules.get(name), "__spec__", None) is not None)))
"""
"""Every module of the agent imported in a fresh interpreter: the top-level modules that brought in, bar those no
finder loaded (`cython_runtime`, which a Cython extension module creates in memory)."""


def _dockerfile_requirements() -> list[Requirement]:
    """The requirements the Dockerfile's `pip install` lines name (quoted requirement specifiers)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [Requirement(spec) for command in re.findall(r"pip install ([^&\n]*)", text)
            for spec in re.findall(r'"([^"]+)"', command)]


def _installed_by_dockerfile() -> set[str]:
    """The distributions the Dockerfile's `pip install` lines name."""
    return {canonicalize_name(requirement.name) for requirement in _dockerfile_requirements()}


def _with_dependencies(names: set[str]) -> set[str]:
    """`names` and what they require (no extras), as pip resolves it, read from the installed metadata."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return seen


def test_every_distribution_the_agent_imports_is_installed_by_its_dockerfile() -> None:
    imported = json.loads(subprocess.run([sys.executable, "-c", _IMPORTED], check=True, capture_output=True,
                                         text=True, cwd=ROOT).stdout)
    provided = _with_dependencies(_installed_by_dockerfile())
    owners = metadata.packages_distributions()
    missing: dict[str, list[str]] = {}
    for module in imported:
        if module in sys.stdlib_module_names or module.startswith("_") or module in OPTIONAL:
            continue
        if module in ("gpu_autoscaler", "gpu_autoscaler_agent"):
            continue  # the project itself, installed with --no-deps
        distributions = {canonicalize_name(d) for d in owners.get(module, [])}
        assert distributions, f"the agent imports {module}, which no installed distribution provides"
        if not distributions & provided:
            missing[module] = sorted(distributions)
    assert not missing, f"imported by the agent but not installed by agent/Dockerfile: {missing}"


def test_the_image_installs_the_agents_dependencies_within_the_projects_own_ranges() -> None:
    """`pip install --no-deps .` skips pyproject's ranges, so the Dockerfile states them again: the same, or the image
    runs a boto3 the project no longer supports (it pinned >=1.35 while pyproject asks >=1.44)."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ranges = {canonicalize_name(r.name): r.specifier for r in map(Requirement, declared)}
    installed = _dockerfile_requirements()
    assert installed
    for requirement in installed:
        assert ranges.get(canonicalize_name(requirement.name)) == requirement.specifier, (
            str(requirement), str(ranges.get(canonicalize_name(requirement.name))))


def test_the_build_context_keeps_what_the_dockerfile_copies_and_nothing_else() -> None:
    """Without a .dockerignore the context was the whole checkout, its virtual environment (~1.4 GB) and git history
    included, sent to the builder on every build; with one, a path the Dockerfile copies must not be left out."""
    copied: set[str] = set()
    for line in DOCKERFILE.read_text().splitlines():
        if match := re.match(r"COPY (?!--from)(.+)", line):
            copied.update(match.group(1).split()[:-1])
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    kept = {line[1:] for line in lines if line.startswith("!")}
    ignored = [line for line in lines if line and line[0] not in "#!"]
    assert ignored[0] == "**"
    assert copied == kept
