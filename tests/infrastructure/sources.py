"""What the functions run: the import closure of their handlers, for tests that check what that code calls."""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["function_sources"]

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE = ROOT / "layers" / "core" / "gpu_autoscaler"


def function_sources() -> list[Path]:
    """Every file of the package the functions can import (their handlers' import closure, lazy imports too):
    helpers only the command line uses (the snapshot builder's ECR and SSM calls) run with their user's
    credentials and botocore, not in Lambda."""
    pending = list((ROOT / "functions").rglob("*.py"))
    seen: set[Path] = set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            for module in modules:
                if not module.startswith("gpu_autoscaler"):
                    continue
                base = PACKAGE.parent / module.replace(".", "/")
                for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                    if candidate.exists():
                        pending.append(candidate)
                if isinstance(node, ast.ImportFrom):  # `from package import module`
                    pending.extend(base / f"{a.name}.py" for a in node.names if (base / f"{a.name}.py").exists())
    return sorted(seen)
