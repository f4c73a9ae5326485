"""Deploy-time and cold-start figures: synth with the real layer, each function's import, Spot warning → cordon."""

from __future__ import annotations

import os
import platform
import sys
from typing import TYPE_CHECKING

from infra.layer import PACKAGE, ROOT, PipLayerBundling, runtime_requirements

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["LOCAL_ARCHITECTURE", "local_layer"]

LOCAL_ARCHITECTURE = {"x86_64": "x86_64", "AMD64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine()]


def local_layer(directory: Path) -> Path:
    """The layer as synth builds it (same pins, same slimming, same cache), for this machine's architecture
    and Python, so its handlers can be imported here: returns its `python/` directory."""
    out = directory
    bundling = PipLayerBundling(
        package_dir=ROOT / "layers" / "core" / PACKAGE,
        requirements=runtime_requirements(),
        architecture=LOCAL_ARCHITECTURE,
        python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
        install_dependencies=True,
    )
    bundling.try_bundle(str(out), image=None)  # type: ignore[arg-type]
    return out / "python"


def layer_size_mb(layer: Path) -> float:
    total = sum(os.path.getsize(p) for p in layer.rglob("*") if p.is_file())
    return total / 2**20
